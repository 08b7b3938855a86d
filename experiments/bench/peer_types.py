"""The shapes of the peers' JSON: the job :mod:`paretorch.experiments.bench.peers` writes for a family's runner
(:mod:`paretorch.experiments.bench.peers_runner`), the result the runner writes back, the rows of the peers table
(peers' and paretorch recipes', :mod:`paretorch.experiments.bench.recipe_rows`) and the ``peers-*.json`` file."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from paretorch.experiments.bench.isa import IsaInfo


class SentenceSet(TypedDict):
    """A timed sentence set of the job: its sentences, and how many times a round runs their batches."""

    sentences: list[str]
    repeat: int


class CorpusJob(TypedDict):
    """The job's corpus: the strings each side ``encode``s whole, and the timed rounds."""

    sentences: list[str]
    rounds: int


class RunnerJob(TypedDict):
    """The job file :mod:`paretorch.experiments.bench.peers` writes for one family."""

    family: str
    peers: list[str]
    model_dir: str
    work_dir: str
    out: str
    threads: int
    batch: int
    rounds: int
    warmup: int
    inputs: dict[str, SentenceSet]
    encode: dict[str, list[str]]
    calibration: list[str]
    corpus: CorpusJob | None
    #: The dynamic-int8 configuration (absent or None: :func:`~paretorch.experiments.bench.peers_runner.cpu_isa`'s).
    isa: NotRequired[str | None]


class PeerInfo(TypedDict, total=False):
    """One peer of the result: how it was made and timed, or the error that stopped it."""

    name: str
    how: str
    file: str
    openvino: dict[str, str]
    prepare_seconds: float
    #: The ``.npy`` file of each ``encode`` text list's embeddings.
    embeddings: dict[str, str]
    #: Per sentence set: :func:`~paretorch.experiments.bench.peers_runner.time_rounds`'s seconds.
    timings: dict[str, dict[str, list[float]]]
    corpus: dict[str, list[float]]
    error: str
    traceback: str


class BaselineInfo(TypedDict):
    how: str
    embeddings: dict[str, str]


class RunnerFacts(TypedDict):
    """The environment of a family's run: versions, threads, instruction set, and the timed batches' shapes."""

    versions: dict[str, str]
    python: str
    threads: int
    torch_threads: int
    affinity: list[int] | None
    isa: str
    #: Per sentence set: each token batch's ``[rows, width]``.
    shapes: dict[str, list[list[int]]]
    #: Per sentence set: each token batch's real tokens.
    tokens: dict[str, list[int]]
    repeat: dict[str, int]


class RunnerResult(RunnerFacts):
    """The result JSON the runner writes next to the job."""

    family: str
    baseline: BaselineInfo
    peers: list[PeerInfo]


class PeerRow(TypedDict, total=False):
    """A row of the peers table: a peer's (``kind`` ``peer``) or a paretorch recipe's (``paretorch``) on one sentence
    set, timed against torch fp32 eager; a row that did not run has its ``error`` instead of the figures."""

    kind: str
    name: str
    family: str
    how: str | None
    versions: dict[str, str]
    recipe_file: str
    inputs: str
    error: str
    #: The median per-round ratio torch / row, its 95% interval, each side's median ms a batch and the rounds.
    speedup: float
    ci: list[float]
    peer_ms: float
    baseline_ms: float
    rounds: int
    batches: int
    #: Each timed batch's width (tokens of its longest row), the widths a static-shape runtime ran, the mean tokens.
    longest: list[int]
    timed_widths: list[int]
    mean_tokens: float
    metric: float
    baseline_metric: float
    held_out: float | None
    baseline_held_out: float | None
    precision: str | None
    openvino: dict[str, str] | None
    file: str | None
    prepare_seconds: float | None
    #: The corpus rows': ``encode()`` of the whole list of strings, its batch, its sentences and their rate.
    workload: str
    end_to_end: bool
    batch: int
    sentences: int
    sentences_per_s: float


class PeersMeasured(TypedDict):
    """What :func:`paretorch.experiments.bench.peers.measure` gives: every row, each family's environment, the
    metric's name, the held-out file."""

    rows: list[PeerRow]
    runs: dict[str, RunnerFacts]
    metric_name: str
    held_out: str | None


class PeersResult(PeersMeasured):
    """A ``peers-<model>-cpu.json`` file."""

    model: str
    device: str
    cpu: str
    isa: IsaInfo
    batch: int
    threads: int
    settings: dict[str, int]
    affinity: list[int] | None
    uptime_before: str
    uptime_after: str
    seconds: float
    date: str
    time_to_peer: NotRequired[dict[str, object]]
    note: NotRequired[str]

