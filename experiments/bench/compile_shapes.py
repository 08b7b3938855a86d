"""MiniLM under torch.compile on the CPU: sequence length dynamic (``compile_dynamic``) against length
buckets (``compile``) and against a static graph at the batch's exact length (the unreachable ideal),
fp32 and bf16, timed in interleaved rounds with fp32-or-bf16 eager, in one process.

    taskset -c 1 .venv/bin/python -m paretorch.experiments.bench.compile_shapes [--rounds 9] [--threads 1]
        [--pairs /work/shared/data/sentence-similarity-dev/pairs.tsv] [--out results/compile-shapes.json]

Two input sets at batch 32, each batch padded to its longest sentence: the spec's latency batch (pydoc
sentences) and, with ``--pairs``, the median-length batch of a sentence-pair file's sentences (tab
separated, columns 6 and 7, no quoting). Prints the compile seconds of each runtime, the graphs dynamo
compiled (the dynamic runtime must compile one for every length), per-round medians (the timing service's rounds,
:func:`paretorch.pipeline.core.timing.time_rounds`) and the ratios.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import NotRequired, TypedDict

import torch
from torch import Tensor, nn
from torch._dynamo.utils import counters

from paretorch.experiments.models.minilm import _tokenizer
from paretorch.experiments.models.minilm import spec as minilm_spec
from paretorch.pipeline.core.latency import LatencySettings
from paretorch.pipeline.core.noise import median_ci
from paretorch.pipeline.core.padding import bucket_length, latency_inputs, pad_to, representative_batch, trim_to_longest
from paretorch.pipeline.core.runtimes.compile import COMPILE
from paretorch.pipeline.core.runtimes.compile_dynamic import COMPILE_DYNAMIC
from paretorch.pipeline.core.runtimes.registry import prepare_runtime
from paretorch.pipeline.core.spec import Batch, load_model
from paretorch.pipeline.core.timing import DeviceTimer, time_first_call, time_rounds
from paretorch.pipeline.sources.huggingface import tokenize

CPU = torch.device("cpu")
#: Per round each side's median of 7 calls (the timing service's rounds, each side warmed up once by 2 calls).
ROUND = LatencySettings(warmup_runs=2, round_runs=7, round_seconds=0.0)
MASK = 1
BATCH = 32


class Ratio(TypedDict):
    """The median of per-round ratios and its 95% interval."""

    median: float
    ci_low: float
    ci_high: float


class FirstCall(TypedDict):
    seconds: float
    graphs: int
    length: int
    max_abs_vs_eager: float


class SetTiming(TypedDict):
    """One input set under every runtime: its length and bucket, each runtime's median ms and their ratios."""

    length: int
    bucket: int
    mean_tokens: float
    median_ms: dict[str, float]
    ratios: dict[str, Ratio]


class DtypeShapes(TypedDict):
    """One dtype: each runtime's first call per input set, graphs for 4 more lengths, and the timed sets."""

    compile: dict[str, FirstCall]
    sets: dict[str, SetTiming]
    dynamic_graphs_for_4_more_lengths: NotRequired[int]


class CompileShapesReport(TypedDict, total=False):
    """A ``compile-shapes-*.json`` file."""

    threads: int
    affinity: list[int]
    torch: str
    load_before: list[float]
    load_after: list[float]
    dtypes: dict[str, DtypeShapes]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def pair_sentences(path: Path) -> list[str]:
    """Columns 6 and 7 of a tab-separated sentence-pair file (no quoting)."""
    sentences: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) >= 7:
            sentences += [fields[5], fields[6]]
    return sentences


def pairs_batch(path: Path) -> Batch:
    """The median-length batch of 32 of the file's sentences (shuffled, seed 0), cut to its longest."""
    sentences = pair_sentences(path)
    random.Random(0).shuffle(sentences)
    sample = tokenize(_tokenizer(), sentences)
    return trim_to_longest(representative_batch(sample, BATCH, MASK), MASK)


def bucketed(inputs: Batch) -> Batch:
    """``inputs`` (cut to their longest) padded up to their length bucket, as ``compile`` is fed."""
    return pad_to(inputs, bucket_length(int(inputs[MASK].shape[1])), MASK)


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def first_call(fn: Callable[..., Tensor], inputs: Batch) -> tuple[float, int, Tensor]:
    """Seconds of the first call (compilation, on the timing service's clock), graphs it compiled, and its output."""
    before = graphs()
    outputs: list[Tensor] = []
    ms = time_first_call(lambda: outputs.append(fn(*inputs)), (), CPU)
    return ms / 1000.0, graphs() - before, outputs[0]


def bound(fn: Callable[..., Tensor], inputs: Batch) -> Callable[..., Tensor]:
    return lambda *_: fn(*inputs)


def ratio_line(name: str, num: list[float], den: list[float]) -> Ratio:
    ratios = sorted(n / d for n, d in zip(num, den, strict=True))
    low, high = median_ci(ratios)
    print(f"  {name}: {statistics.median(ratios):.3f} [{low:.3f}, {high:.3f}]")
    return {"median": statistics.median(ratios), "ci_low": low, "ci_high": high}


def measure(model: nn.Module, sets: dict[str, Batch], rounds: int) -> DtypeShapes:
    """One dtype: compile both runtimes, check outputs and graphs, time in interleaved rounds."""
    result: DtypeShapes = {"compile": {}, "sets": {}}
    eager = model
    dynamic = prepare_runtime(copy.deepcopy(model), COMPILE_DYNAMIC.name, CPU)
    static = prepare_runtime(copy.deepcopy(model), COMPILE.name, CPU)
    with torch.no_grad():
        references = {name: eager(*inputs) for name, inputs in sets.items()}
    for index, (name, inputs) in enumerate(sets.items()):
        bucket = bucketed(inputs)
        entries = {"dynamic": (dynamic, inputs), "static_bucket": (static, bucket), "static_exact": (static, inputs)}
        for runtime, (fn, batch) in entries.items():
            if runtime == "static_exact" and batch[MASK].shape[1] == bucket[MASK].shape[1]:
                continue
            seconds, new_graphs, out = first_call(fn, batch)
            error = float((out.float() - references[name].float()).abs().max())
            key = f"{runtime}@{name}"
            result["compile"][key] = {"seconds": round(seconds, 2), "graphs": new_graphs, "length":
                                      int(batch[MASK].shape[1]), "max_abs_vs_eager": error}
            print(f"  first call {key} (length {batch[MASK].shape[1]}): {seconds:.1f} s, "
                  f"{new_graphs} new graph(s), max |out - eager| {error:.2e}", flush=True)
            if runtime == "dynamic" and index > 0 and new_graphs:
                print(f"  WARNING: the dynamic runtime compiled {new_graphs} graph(s) for a new length")
    # more lengths through the dynamic graph: no new graph
    before = graphs()
    with torch.no_grad():
        for length in (5, 9, 17, 40):
            dynamic(*tuple(t[:, :length] for t in next(iter(sets.values()))))
    result["dynamic_graphs_for_4_more_lengths"] = graphs() - before
    print(f"  dynamic runtime, 4 more lengths: {result['dynamic_graphs_for_4_more_lengths']} new graph(s)")
    for name, inputs in sets.items():
        bucket = bucketed(inputs)
        functions = {"eager": bound(eager, inputs), "dynamic": bound(dynamic, inputs),
                     "static_bucket": bound(static, bucket), "static_exact": bound(static, inputs)}
        sides = [(fn, ()) for fn in functions.values()]
        timer = DeviceTimer(CPU, ROUND)
        timer.warm_up(sides)
        # the order reversed every other round
        samples = dict(zip(functions, time_rounds(sides, timer, rounds), strict=True))
        length, width = int(inputs[MASK].shape[1]), int(bucket[MASK].shape[1])
        tokens = float(inputs[MASK].sum(dim=1).float().mean())
        print(f" {name}: batch {BATCH} x {length} tokens (mean {tokens:.1f}), bucket {width}")
        for key, values in samples.items():
            print(f"  {key}: median {statistics.median(values):.2f} ms")
        summary: SetTiming = {
            "length": length, "bucket": width, "mean_tokens": tokens,
            "median_ms": {k: statistics.median(v) for k, v in samples.items()},
            "ratios": {
                "static_bucket / dynamic": ratio_line("static_bucket / dynamic", samples["static_bucket"],
                                                      samples["dynamic"]),
                "dynamic / static_exact": ratio_line("dynamic / static_exact", samples["dynamic"],
                                                     samples["static_exact"]),
                "eager / dynamic": ratio_line("eager / dynamic", samples["eager"], samples["dynamic"]),
                "eager / static_bucket": ratio_line("eager / static_bucket", samples["eager"],
                                                    samples["static_bucket"]),
            },
        }
        result["sets"][name] = summary
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pairs", type=Path, default=None)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = minilm_spec()
    sets = {"pydoc": latency_inputs(spec, BATCH, "eager")[0]}
    if args.pairs is not None:
        sets["dev_pairs"] = pairs_batch(args.pairs)
    report: CompileShapesReport = {"threads": args.threads, "affinity": sorted(os.sched_getaffinity(0)),
                                   "torch": torch.__version__, "load_before": load_average(), "dtypes": {}}
    print(f"threads {args.threads}, cores {report['affinity']}, load {report['load_before']}")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        torch.compiler.reset()
        model = load_model(spec).to(dtype).eval()
        print(f"{dtype_name}:", flush=True)
        report["dtypes"][dtype_name] = measure(model, sets, args.rounds)
    report["load_after"] = load_average()
    print(f"load after {report['load_after']}")
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
