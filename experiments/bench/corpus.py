"""A whole corpus embedded from its strings: a deployed recipe's ``encode`` against sentence-transformers' ``encode``.

    taskset -c 0 python -m experiments.bench.corpus PAIRS.tsv [--rounds 5] [--threads 1] [--batch 32]

``PAIRS.tsv``: sentence pairs in the STS benchmark layout (the distinct sentences are the corpus; e.g.
``../shared/data/sentence-similarity-dev/pairs.tsv``). In one process, one thread, each variant embeds the whole
corpus from its strings to normalized float32 host embeddings, tokenization included, in rounds (every variant once
per round, the order rotated each round): sentence-transformers' own ``SentenceTransformer(path).encode`` (the
one-line fp32 path, which sorts by length), and a pack recipe's deployment (``pipeline apply``'s ``deploy/`` folder,
loaded with :func:`pipeline.api.load_deployment`) three ways: ``encode`` as shipped (sorted by length, the next
batch tokenized while the model runs), sorted without the overlap, and in the corpus' order without either. Each
row: its median wall time per corpus, sentences per second, its speed-up against the one-liner in the same rounds
(median of the per-round ratios, with their range), and its lowest per-input cosine to the one-liner's embeddings.
One JSON file, ``corpus-minilm-cpu.json``, rendered into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from experiments.bench.fidelity_check import read_pairs
from experiments.bench.isa import isa_info
from experiments.bench.paths import RESULTS_DIR
from experiments.models import minilm
from pipeline.api import StageContext, load_deployment, load_model, run_chain
from pipeline.core.input_agreement import InputAgreement
from pipeline.engine.deployment import save_deployment
from pipeline.engine.recipe import Recipe
from stages.pack.stage import PackConfig
from stages.quantize.stage import QuantizeConfig

CORPUS_PREFIX = "corpus-"
RESULT_FILE = f"{CORPUS_PREFIX}minilm-cpu.json"
ONE_LINER = "sentence-transformers fp32 encode()"


def deployed(spec: Any, recipe: Recipe, folder: Path) -> Any:
    """The recipe's deployment, written and loaded back the way a user gets it."""
    model = run_chain(load_model(spec), list(recipe.stages), StageContext(spec, torch.device("cpu"))).model
    save_deployment(model, recipe, folder)
    return load_deployment(folder, spec)


def variants(encoder: Any, one_liner: Any, batch: int) -> dict[str, Callable[[Sequence[str]], Tensor]]:
    def st(texts: Sequence[str]) -> Tensor:
        return one_liner.encode(list(texts), batch_size=batch, convert_to_tensor=True).float().cpu()

    return {
        ONE_LINER: st,
        "deployment encode() (sorted, overlapped)": lambda texts: encoder.encode(texts, batch),
        "deployment, sorted, no overlap": lambda texts: encoder.encode(texts, batch, overlap=False),
        "deployment, corpus order, no overlap": lambda texts: encoder.encode(texts, batch, sort=False, overlap=False),
    }


def measure(runs: dict[str, Callable[[Sequence[str]], Tensor]], corpus: Sequence[str], rounds: int,
            log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    names = list(runs)
    outputs = {name: fn(corpus) for name, fn in runs.items()}  # warm-up, and the embeddings compared
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for number in range(rounds):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            runs[name](corpus)
            seconds[name].append(time.perf_counter() - start)
        log(f"round {number + 1}/{rounds}: " + ", ".join(f"{n[:24]} {seconds[n][-1]:.2f} s" for n in names))
    reference = outputs[ONE_LINER]
    rows = {}
    for name in names:
        ratios = [b / s for b, s in zip(seconds[ONE_LINER], seconds[name], strict=True)]
        agreement = InputAgreement.of(outputs[name], reference, "embedding")
        rows[name] = {"seconds": seconds[name], "median_s": statistics.median(seconds[name]),
                      "sentences_per_s": len(corpus) / statistics.median(seconds[name]),
                      "speedup": statistics.median(ratios), "speedup_range": [min(ratios), max(ratios)],
                      "min_cosine_to_one_liner": float(agreement.values.min())}
    return rows


def render(result: dict[str, Any]) -> str:
    lines = [f"### A corpus from its strings: {result['sentences']} sentences, MiniLM, {result['cpu']}, "
             f"{result['threads']} thread(s), batch {result['batch']}", "",
             f"{result['date']}; recipe `{result['recipe']}` deployed (`load_deployment`); {result['rounds']} rounds, "
             f"every variant once a round, order rotated; load {result['load_start'][0]:.1f} before, "
             f"{result['load_end'][0]:.1f} after ({result['note']}). Wall time per corpus, strings to normalized "
             "float32 host embeddings, tokenization included.", "",
             "| variant | median s / corpus | sentences/s | vs the one-liner [range] "
             "| lowest cosine to its embeddings |",
             "| --- | --- | --- | --- | --- |"]
    for name, row in result["rows"].items():
        low, high = row["speedup_range"]
        lines.append(f"| {name} | {row['median_s']:.2f} | {row['sentences_per_s']:.0f} | {row['speedup']:.2f}x "
                     f"[{low:.2f}, {high:.2f}] | {row['min_cosine_to_one_liner']:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--note", default="", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer  # the peer's own package, here for its one-liner

    corpus = read_pairs(args.pairs).sentences
    spec = minilm.spec()
    recipe = Recipe((PackConfig(), QuantizeConfig(method="int8_dynamic")), runtime="eager", model=spec.name)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        encoder = deployed(spec, recipe, Path(folder) / "deploy")
        one_liner = SentenceTransformer(str(minilm.model_dir()), device="cpu")
        rows = measure(variants(encoder, one_liner, args.batch), corpus, args.rounds, print)
    result = {"model": "minilm", "device": "cpu", "cpu": platform.processor() or platform.machine(),
              "isa": isa_info(), "torch": torch.__version__, "threads": torch.get_num_threads(), "batch": args.batch,
              "recipe": recipe.describe(), "sentences": len(corpus), "rounds": args.rounds,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": load_start,
              "load_end": os.getloadavg(), "note": args.note or "nothing else stated", "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / RESULT_FILE).write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
