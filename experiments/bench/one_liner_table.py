"""The shape of a ``one-liners-*.json`` file (:mod:`paretorch.experiments.bench.one_liners`) and its BENCHMARKS.md
section: the search's best against the one-liners on a held-out model, all timed in the same interleaved rounds."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from paretorch.pipeline.core.input_agreement import cell

ONE_LINERS_PREFIX = "one-liners-"


class _RowBase(TypedDict):
    name: str
    #: ``baseline`` (torch fp32 eager), ``one-liner`` (a library's public call on the unmodified model) or ``search``.
    kind: str
    #: The call that made it (a one-liner), or the recipe (the search's best).
    how: str


class OneLinerRow(_RowBase, total=False):
    """One row: its metric, drop and speed-up over the shared rounds, or ``error`` when it could not be made."""

    metric: float
    drop: float
    within_drop: bool
    #: Its inputs against torch fp32 eager's outputs (:meth:`~paretorch.pipeline.core.input_agreement.InputAgreement.
    #: metrics`), whether they pass the search's per-input guard, and why not (absent from older files).
    inputs: dict[str, float]
    within_tail: bool
    tail: str
    #: Median over the rounds of the per-round ratio torch fp32 eager / this row, with its 95 % interval.
    speedup: float
    ci: list[float]
    #: This row's median time a call over the rounds, in ms.
    ms: float
    #: Seconds to make it (export, quantization, conversion and session; the search's best: replay and measure).
    prepare_seconds: float
    #: What the runtime ran in where it picks (OpenVINO's inference precision).
    precision: str
    error: str


class BestAgainstOneLiner(TypedDict):
    """The search's best against the fastest one-liner within the allowed drop: the median per-round ratio
    one-liner / best (above 1: the best is faster) with its 95 % interval."""

    one_liner: str
    ratio: float
    ci: list[float]


class SearchSummary(TypedDict):
    trials: int
    search_seconds: float
    best_trial: int
    best_recipe: str
    runtimes: list[str]
    #: ``[seconds since the search started, best feasible speed-up so far]``: the search's own curve.
    time_to_result: list[list[float]]
    #: Seconds from the search's start (the study's start included) to each finished trial's end, by trial number.
    trials_completed: NotRequired[list[float]]


class RowsMachine(TypedDict):
    """What every rows file of a model records of its run: the model, the device and CPU, batch, threads, pinning."""

    model: str
    device: str
    cpu: str
    batch: int
    threads: int
    affinity: list[int] | None


class OneLinerResult(RowsMachine):
    #: The 1-, 5- and 15-minute load averages before and after, and the cores the machine has.
    load_before: str
    load_after: str
    date: str
    versions: dict[str, str]
    metric_name: str
    max_drop: str
    allowed_drop: float
    rounds: int
    seconds: float
    search: SearchSummary
    rows: list[OneLinerRow]
    best_against_one_liner: BestAgainstOneLiner | None
    #: The command line that made the file (absent from older files: the table then prints the short form).
    command: NotRequired[str]
    #: What the numbers cannot show by themselves (``--note``: e.g. the other work on a shared machine).
    note: NotRequired[str]


def _row_line(row: OneLinerRow) -> str:
    name = row["name"].replace("|", "\\|")
    how = row["how"].replace("|", "\\|")
    if "error" in row:
        return f"| {name} | - | - | - | - | - | did not run: {row['error']} | `{how}` |"
    low, high = row["ci"]
    within = "" if row["within_drop"] else " (over the drop)"
    precision = f", {row['precision']}" if row.get("precision") else ""
    inputs = cell(row["inputs"]) if "inputs" in row else "-"
    if not row.get("within_tail", True):
        inputs += " (over the tail limit)"
    return (f"| {name} | {row['metric']:.4f}{within} | {inputs} | {row['speedup']:.2f}x [{low:.2f}, {high:.2f}] | "
            f"{row['ms']:.2f} | {row['prepare_seconds']:.1f} | {row['kind']}{precision} | `{how}` |")


def _verdict(result: OneLinerResult) -> str:
    best = result["best_against_one_liner"]
    search = result["search"]
    minutes = search["search_seconds"] / 60
    timing = f"The search: {search['trials']} trials in {minutes:.1f} min{_trial_times(search)} (issue 46's targets: "
    timing += "a CNN, 20 trials within 30 minutes on a quiet core; a 100M-parameter text encoder, trial 0 within 10 "
    timing += "and 10 trials within 60 minutes)."
    if best is None:
        return timing + (" No one-liner stayed within the allowed drop and the per-input guard: nothing to compare the "
                         "best with.")
    low, high = best["ci"]
    if low > 1.0:
        level = "faster than"
    elif high < 1.0:
        level = "slower than"
    else:
        level = "level with"
    return (timing + f" Its best is **{level} the fastest one-liner within the drop and the per-input guard** "
            f"({best['one_liner']}): "
            f"{best['ratio']:.2f}x [{low:.2f}, {high:.2f}] (that one-liner's time / the best's, per round).")


def _command(result: OneLinerResult) -> str:
    return result.get("command") or (f"python -m paretorch.experiments.bench.one_liners --model {result['model']} "
                                     f"--trials {result['search']['trials']}")


def _trial_times(search: SearchSummary) -> str:
    """``; trial 0 ended after 3.5 min, all 10 after 30.2 min`` (the study's start included), where recorded."""
    ended = search.get("trials_completed") or []
    if not ended:
        return ""
    return f"; trial 0 ended after {ended[0] / 60:.1f} min, all {len(ended)} after {ended[-1] / 60:.1f} min"


def render(result: OneLinerResult) -> str:
    """A Markdown section of one one-liners file."""
    versions = ", ".join(f"{name} {version}" for name, version in result["versions"].items())
    lines = [
        f"### The search's best against the one-liners: {result['model']} on {result['device']}, batch "
        f"{result['batch']}",
        "",
        f"`{_command(result)}` ({result['date']}; {versions}): {result['threads']} thread(s) for torch, "
        f"onnxruntime and OpenVINO, CPU affinity {result['affinity']} ({result['cpu']}); load average before: "
        f"{result['load_before']}, after: {result['load_after']}. Every row in the same {result['rounds']} "
        "rounds, interleaved (the order reversed every other round); speed-up: the median of the per-round ratios to "
        f"torch fp32 eager [95% CI]. Metric: {result['metric_name']} on the spec's evaluation data, from each row's "
        f"own outputs; allowed drop {result['max_drop']} = {result['allowed_drop']:g}. Inputs: each row's outputs "
        "against torch fp32 eager's, input by input, under the search's own per-input guard (the best is compared "
        "with the fastest one-liner that passes both, as the search itself would judge it). The search's best: "
        f"`{result['search']['best_recipe']}` (trial {result['search']['best_trial']}).",
        "",
        f"| row | {result['metric_name']} | inputs vs torch fp32 | speed-up vs torch fp32 eager | ms a call "
        "| made in s | kind | how |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(_row_line(row) for row in result["rows"]),
        "",
        _verdict(result),
    ]
    if result.get("note"):
        lines += ["", f"Note: {result.get('note')}"]
    return "\n".join(lines)
