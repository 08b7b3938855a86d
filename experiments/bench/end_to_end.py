"""Strings in, embeddings out, as users run a text encoder: MiniLM end to end on a ``serve`` stream or a ``corpus``.

    python -m paretorch.experiments.bench.end_to_end PAIRS.tsv [--device cpu|cuda] [--workload serve|corpus]
        [--batch 32] [--recipe R.json ...] [--rounds 5] [--threads 1] [--limit N] [--note TEXT] [--out DIR]

``PAIRS.tsv``: sentence pairs (``--eval-data``'s ``sentence1, sentence2, score`` layout, or the STS benchmark's raw
one); its distinct sentences, in order of first appearance, are the ``dev sentences`` set; MiniLM's own latency
sentences (256 pydoc sentences) are the ``built-in sample``. In one process each variant runs the workload from the
strings to float32 host embeddings, tokenization included (:mod:`paretorch.pipeline.core.workload`): ``serve`` the texts
in the given order in batches of ``--batch``, ``corpus`` the
whole list encoded at once (sorted by length where the variant sorts: sentence-transformers' ``encode`` and a
deployment's ``encode`` do). Every variant runs once per round, the order reversed every other round (the timing
service's rounds, :func:`paretorch.pipeline.core.timing.alternate`, on the host clock); the speed-up of each is
the median of its per-round ratios to **fp32 eager run the same way** (the unoptimized model behind the same
``encode`` code as a deployment, :class:`paretorch.pipeline.core.text_batches.ModelEncoder`) with its 95 % interval, and
``vs one-liner`` its ratio to the fastest sentence-transformers variant in the same rounds.

Variants: fp32 eager (and without the overlap); sentence-transformers' own ``SentenceTransformer(path).encode`` (on
``serve``: one ``encode`` call per batch, as a server calls it), and on an accelerator its ``.half()``, bf16 and
``.half()`` + ``torch.compile`` forms; each ``--recipe`` (a search's ``recipe.json``) deployed as a user gets it (the
``deploy/`` folder written and loaded with :func:`paretorch.pipeline.api.load_deployment`), its ``encode`` as shipped
and without the overlap; and the tokenizer alone (the spec's ``encode_text`` over the same batches). Rows carry
``"workload"``, ``"batch"`` and ``"end_to_end": true``; one JSON file,
``end-to-end-minilm-<device>-<workload>-b<batch>.json``, rendered into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import Tensor

from paretorch.experiments.bench.fidelity_check import read_pairs
from paretorch.experiments.bench.isa import cpu_description, isa_info
from paretorch.experiments.bench.paths import RESULTS_DIR
from paretorch.experiments.models import minilm
from paretorch.pipeline.api import load_deployment, load_model
from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.input_agreement import InputAgreement
from paretorch.pipeline.core.latency import LatencySettings
from paretorch.pipeline.core.noise import median_ci
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.task_data import PairsData, load_task_data
from paretorch.pipeline.core.task_spec import distinct_texts
from paretorch.pipeline.core.text_batches import ModelEncoder, TextBatches
from paretorch.pipeline.core.timing import DeviceTimer, Timed, alternate
from paretorch.pipeline.engine.deployment import save_deployment
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.runner import Runner

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

PREFIX = "end-to-end-"
BASELINE = "fp32 eager"
ONE_LINER = "sentence-transformers fp32 encode()"
TOKENIZER = "tokenizer alone"
DEV_SET, SAMPLE_SET = "dev sentences", "built-in sample"
#: Texts a ``serve`` stream at batch 1 runs by default (one request each).
SERVE_B1_TEXTS = 256

Variant = Callable[[Sequence[str]], Tensor]


class EndToEndRow(TypedDict, total=False):
    """A variant on one sentence set: each round's seconds, their median as ms a batch and sentences a second, the
    speed-up over fp32 eager and against the fastest one-liner (with one-liners), the lowest cosine to fp32."""

    seconds: list[float]
    median_s: float
    ms_per_batch: float
    sentences_per_s: float
    speedup: float
    ci: list[float]
    vs_one_liner: float
    fastest_one_liner: str
    min_cosine_to_fp32: float
    workload: str
    batch: int
    end_to_end: bool


class SentenceSetRows(TypedDict):
    sentences: int
    mean_tokens: float
    rows: dict[str, EndToEndRow]


class EndToEndResult(TypedDict, total=False):
    """An ``end-to-end-*.json`` file."""

    model: str
    device: str
    workload: str
    batch: int
    end_to_end: bool
    device_name: str
    torch: str
    threads: int
    rounds: int
    recipes: list[str]
    date: str
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    note: str
    #: How the rounds ordered the variants (files before the timing service rotated them: read as "order rotated").
    order: str
    sets: dict[str, SentenceSetRows]


#: The round order of this bench's runs (:func:`paretorch.pipeline.core.timing.alternate`).
ROUND_ORDER = "the order reversed every other round"


def chunks(texts: Sequence[str], batch: int) -> list[list[str]]:
    return [list(texts[i : i + batch]) for i in range(0, len(texts), batch)]


def pair_sentences(path: Path) -> list[str]:
    """The distinct sentences of a pairs file, in order of first appearance: a ``sentence1, sentence2, score``
    table (``--eval-data``'s layout, ``python -m paretorch.experiments.data.sts_benchmark`` writes it), or the STS
    benchmark's raw layout (score in column 5, the sentences in 6 and 7)."""
    try:
        data = load_task_data(str(path))
    except SpecError:  # not the --eval-data layout: the raw STS one
        return read_pairs(path).sentences
    if not isinstance(data, PairsData):
        raise SystemExit(f"error: {path} holds {data.task} data; give sentence pairs")
    return distinct_texts([*data.first, *data.second])[0]


def deployed(spec: ModelSpec, recipe: Recipe, folder: Path, device: torch.device) -> TextBatches:
    """The recipe's deployment, written as ``pipeline apply`` writes it (the runner's model, the file a file
    runtime ran) and loaded back with :func:`paretorch.pipeline.api.load_deployment`, as a user gets it: an
    encoder of strings (a deployment of another kind is an error)."""
    runner = Runner(recipe_pipeline(recipe.model_stages()), spec, device)
    result = runner.run({}, recipe.runtime, exports=False, evaluate=False)
    save_deployment(result.model, result.recipe(spec.name), folder, runner.runtime_file({}, recipe.runtime))
    encoder = load_deployment(folder, spec, device)
    if not isinstance(encoder, TextBatches):
        raise TypeError(f"{recipe.describe()} deploys a {type(encoder).__name__}, not an encoder of strings")
    return encoder


def one_liners(device: torch.device, batch: int, workload: str) -> dict[str, Variant]:
    """sentence-transformers' own paths: fp32, and on an accelerator half, bf16 and half + torch.compile."""
    from sentence_transformers import SentenceTransformer  # the peer's own package, here for its one-liner

    def encode_with(model: SentenceTransformer) -> Variant:
        def run(texts: Sequence[str]) -> Tensor:
            parts = chunks(texts, batch) if workload == "serve" else [list(texts)]
            return torch.cat([model.encode(part, batch_size=batch, convert_to_tensor=True).float().cpu()
                              for part in parts])
        return run

    path = str(minilm.model_dir())

    def loaded() -> Any:  # float32 as stored in the package (a carried fp16 copy would load as fp16)
        return SentenceTransformer(path, device=str(device)).float()

    variants = {ONE_LINER: encode_with(loaded())}
    if device.type != "cpu":
        variants["sentence-transformers .half() encode()"] = encode_with(loaded().half())
        variants["sentence-transformers bf16 encode()"] = encode_with(loaded().to(torch.bfloat16))
        compiled = loaded().half()
        # The Transformer module's model is its submodule ``model`` (``auto_model`` is a read-only property in
        # sentence-transformers 6: an assignment to it registered a second, unused submodule and ran uncompiled).
        compiled[0].model = torch.compile(compiled[0].model, dynamic=True)
        variants["sentence-transformers .half() + torch.compile encode()"] = encode_with(compiled)
    return variants


def encoding(encoder: TextBatches, batch: int, sort: bool, overlap: bool | None = None) -> Variant:
    """A deployment's ``encode`` as a variant."""
    return lambda texts: encoder.encode(texts, batch, sort=sort, overlap=overlap)


def prefixed(prefix: str) -> Callable[[str], None]:
    """Progress lines under ``prefix``."""
    return lambda line: print(f"{prefix}: {line}", flush=True)


def variants(spec: ModelSpec, recipes: Sequence[Recipe], folder: Path, device: torch.device, batch: int,
             workload: str, peers: bool = True) -> dict[str, Variant]:
    """Every variant of the run, the baseline first."""
    sort = workload == "corpus"
    encode_text = spec.encode_text
    assert encode_text is not None
    fp32 = ModelEncoder(load_model(spec).to(device), device, spec.padding_mask, encode_text=encode_text)
    runs: dict[str, Variant] = {BASELINE: lambda texts: fp32.encode(texts, batch, sort=sort),
                                f"{BASELINE}, no overlap": lambda texts: fp32.encode(texts, batch, sort=sort,
                                                                                      overlap=False)}
    if peers:
        runs.update(one_liners(device, batch, workload))
    for number, recipe in enumerate(recipes):
        encoder = deployed(spec, recipe, folder / f"deploy-{number}", device)
        name = f"deployed `{recipe.describe()}`"
        runs[f"{name} encode()"] = encoding(encoder, batch, sort)
        runs[f"{name}, no overlap"] = encoding(encoder, batch, sort, overlap=False)

    def tokens_only(texts: Sequence[str]) -> Tensor:
        ordered = sorted(texts, key=len, reverse=True) if sort else list(texts)
        return torch.cat([encode_text(part)[0][:, :1].float() for part in chunks(ordered, batch)])

    runs[TOKENIZER] = tokens_only
    return runs


#: One call a side per round, untimed warm-up left to the caller (the first call, whose outputs are compared).
ONE_CALL = LatencySettings(warmup_runs=0, round_runs=1, round_seconds=0.0)


def _bound(run: Variant, texts: Sequence[str]) -> Callable[[], Tensor]:
    return lambda: run(texts)


def measure(runs: dict[str, Variant], texts: Sequence[str], rounds: int, batch: int,
            log: Callable[[str], None]) -> dict[str, EndToEndRow]:
    """Every variant once per round on the timing service's rounds (the order reversed every other round, each call on
    the host clock: the outputs end on the host); per variant its seconds and ratios to the baseline."""
    names = list(runs)
    outputs = {name: runs[name](texts) for name in names}  # warm-up (a compiled path compiles here)
    sides: list[Timed] = [(_bound(runs[name], texts), ()) for name in names]

    def done(samples: Sequence[Sequence[float]]) -> str | None:
        log(f"round {len(samples[0])}/{rounds}: " + ", ".join(f"{n[:28]} {ms[-1] / 1000:.3f} s"
                                                               for n, ms in zip(names, samples, strict=True)))
        return "rounds" if len(samples[0]) >= rounds else None

    timed, _ = alternate(sides, DeviceTimer(torch.device("cpu"), ONE_CALL), done)
    seconds = {name: [ms / 1000 for ms in values] for name, values in zip(names, timed, strict=True)}
    peers = [name for name in names if name.startswith("sentence-transformers")]
    fastest = min(peers, key=lambda name: statistics.median(seconds[name])) if peers else None
    batches = -(-len(texts) // batch)
    rows: dict[str, EndToEndRow] = {}
    for name in names:
        ratios = [b / s for b, s in zip(seconds[BASELINE], seconds[name], strict=True)]
        median_s = statistics.median(seconds[name])
        row: EndToEndRow = {
            "seconds": seconds[name], "median_s": median_s, "ms_per_batch": 1000 * median_s / batches,
            "sentences_per_s": len(texts) / median_s, "speedup": statistics.median(ratios),
            "ci": list(median_ci(ratios))}
        if fastest is not None:
            versus = [p / s for p, s in zip(seconds[fastest], seconds[name], strict=True)]
            row |= {"vs_one_liner": statistics.median(versus), "fastest_one_liner": fastest}
        if name != TOKENIZER:
            agreement = InputAgreement.of(outputs[name], outputs[BASELINE], "embedding")
            row["min_cosine_to_fp32"] = float(agreement.values.min())
        rows[name] = row
    return rows


def render(result: EndToEndResult) -> str:
    """One table per sentence set of the result."""
    workload, batch = result["workload"], result["batch"]
    how = ("in the given order, batch by batch" if workload == "serve" else "encoded whole, sorted where the variant "
           "sorts")
    lines = [f"### End to end, `{workload}` b{batch}: MiniLM on {result['device_name']}, strings to host embeddings",
             "", f"{result['date']}; {result['threads']} thread(s); {result['rounds']} rounds, every variant once a "
             f"round, {result.get('order', 'order rotated')}; load {result['load_start'][0]:.1f} before, "
             f"{result['load_end'][0]:.1f} after "
             f"({result['note']}). Each set {how}, tokenization included; speed-up: median of per-round ratios to fp32 "
             "eager run the same way [95 % CI]; `vs one-liner`: against the fastest sentence-transformers variant in "
             "the same rounds."]
    for name, block in result["sets"].items():
        lines += ["", f"**{name}** ({block['sentences']} sentences, mean {block['mean_tokens']:.1f} tokens)", "",
                  "| variant | ms / batch | sentences/s | vs fp32 eager [95% CI] | vs one-liner "
                  "| lowest cosine to fp32 |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for variant, row in block["rows"].items():
            low, high = row["ci"]
            cosine = f"{row['min_cosine_to_fp32']:.4f}" if "min_cosine_to_fp32" in row else "-"
            lines.append(f"| {variant} | {row['ms_per_batch']:.2f} | {row['sentences_per_s']:.0f} | "
                         f"{row['speedup']:.2f}x [{low:.2f}, {high:.2f}] | "
                         f"{row.get('vs_one_liner', math.nan):.2f}x | {cosine} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workload", choices=("serve", "corpus"), default="corpus")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--recipe", type=Path, action="append", default=[], help="a recipe.json to deploy")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many texts a set")
    parser.add_argument("--no-one-liners", action="store_true", help="leave sentence-transformers' variants out")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    limit = args.limit or (SERVE_B1_TEXTS if args.workload == "serve" and args.batch == 1 else None)
    spec = minilm.spec()
    sets = {DEV_SET: pair_sentences(args.pairs), SAMPLE_SET: minilm.sentences("evaluation")}
    recipes = [Recipe.load(path) for path in args.recipe]
    load_start = os.getloadavg()
    result: EndToEndResult = {
        "model": "minilm", "device": device.type, "workload": args.workload, "batch": args.batch,
        "end_to_end": True, "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                                            else f"{cpu_description()} ({isa_info()['torch_capability']})"),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "rounds": args.rounds,
        "recipes": [r.describe() for r in recipes], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_start": load_start, "note": args.note or "nothing else stated", "order": ROUND_ORDER, "sets": {}}
    with tempfile.TemporaryDirectory() as folder:
        runs = variants(spec, recipes, Path(folder), device, args.batch, args.workload, not args.no_one_liners)
        for name, texts in sets.items():
            texts = texts[:limit] if limit else texts
            assert spec.encode_text is not None
            tokens = [float(spec.encode_text(part)[1].sum(1).float().mean()) for part in chunks(texts, 256)]
            rows = measure(runs, texts, args.rounds, args.batch, prefixed(name))
            result["sets"][name] = {"sentences": len(texts), "mean_tokens": statistics.fmean(tokens),
                                    "rows": {variant: {"workload": args.workload, "batch": args.batch,
                                                       "end_to_end": True, **row} for variant, row in rows.items()}}
    result["load_end"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{PREFIX}minilm-{device.type}-{args.workload}-b{args.batch}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
