"""Length-grouped calls of an exported model, padded against grouped: what packing buys OpenVINO and ONNX Runtime.

    taskset -c 1 python -m paretorch.experiments.bench.length_groups --recipe runs/bench/best-minilm-cpu.json
        [--rows 4 8 16]
    taskset -c 1 python -m paretorch.experiments.bench.length_groups --peer-ir PEER.xml
        # the peer's IR, grouped the same way

A padded batch computes every padding token: MiniLM's latency batch (32 sentences, 61 tokens at the longest, 32.2
on average) is half padding. torch's ``pack`` stage drops it inside the model (varlen attention), which an exported
graph cannot; ``onnxruntime`` and ``openvino`` reproduce it at the call (:mod:`paretorch.pipeline.core.length_groups`:
rows sorted by length, groups of ``rows`` rows, each trimmed to its own longest row). This bench times a file's plain
padded call against that grouped call, paired in alternating rounds in one process
(:func:`paretorch.pipeline.core.paired.measure_paired`), on the latency batch the search times, for several group sizes:
a recipe replayed with the engine's runner (its runtime's prepared call, recipe without ``pack``: padded), or
``--peer-ir``: a peer's OpenVINO IR (sentence-transformers' NNCF int8, compiled the peer's way, pooled as
sentence-transformers pools), which says what the peer would gain from the same grouping.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NotRequired, TypedDict

import torch
from torch import Tensor

from paretorch.experiments.bench.isa import IsaInfo, isa_info
from paretorch.experiments.bench.ov_int8 import PlainIr
from paretorch.experiments.bench.paths import RESULTS_DIR
from paretorch.experiments.bench.recipe_rows import replay
from paretorch.experiments.bench.settings import BENCH_LATENCY
from paretorch.pipeline.core.device import resolve_device
from paretorch.pipeline.core.length_groups import LengthGrouped
from paretorch.pipeline.core.padding import latency_sample, trim_to_longest
from paretorch.pipeline.core.paired import measure_paired
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.timing import DeviceTimer, host_seconds, process_clock
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.sources.resolve import resolve_spec

LENGTH_GROUPS_PREFIX = "length-groups-"


class GroupRow(TypedDict):
    """Groups of ``rows_per_group`` rows against the padded call: paired speed-up, medians, largest output change."""

    rows_per_group: NotRequired[int]
    groups: int
    speedup_over_padded: float
    ci: list[float]
    grouped_ms: float
    padded_ms: float
    max_abs_change: float
    unstable: str | None
    machine: str


class Named(TypedDict):
    """What a result names its call by: the recipe (or the peer IR) and its runtime."""

    recipe: str
    runtime: str


class GroupsMeasured(TypedDict):
    model: str
    batch: int
    longest: int
    mean_tokens: float
    rows: list[GroupRow]


class LengthGroupsResult(Named, GroupsMeasured):
    """A ``length-groups-*.json`` file."""

    threads: int
    isa: IsaInfo
    seconds: float
    date: str


def measure(fn: Callable[..., Tensor], spec: ModelSpec, rows: Sequence[int], batch: int,
            device: torch.device) -> GroupsMeasured:
    """``fn`` padded and grouped in groups of each of ``rows``: paired speed-up and largest output change."""
    if spec.padding_mask is None:
        raise SystemExit(f"error: {spec.name} takes no padding mask: length groups do not apply")
    inputs = trim_to_longest(latency_sample(spec, batch), spec.padding_mask)
    lengths = inputs[spec.padding_mask].ne(0).sum(dim=1)
    timer = DeviceTimer(device, BENCH_LATENCY)
    with torch.no_grad():
        padded = fn(*inputs)
    measured: list[GroupRow] = []
    for size in rows:
        call = LengthGrouped(fn, spec.padding_mask, size)
        with torch.no_grad():
            change = float((call(*inputs) - padded).abs().max())
        paired = measure_paired((fn, inputs), (call, inputs), timer, BENCH_LATENCY, cpu_clock=process_clock)
        groups = math.ceil(batch / size)
        measured.append({"rows_per_group": size, "groups": groups, "speedup_over_padded": paired.speedup,
                         "ci": list(paired.ci), "grouped_ms": paired.trial_ms, "padded_ms": paired.baseline_ms,
                         "max_abs_change": change, "unstable": paired.unstable, "machine": paired.machine.describe()})
        print(f"groups of {size} ({groups} calls): {paired.speedup:.2f}x [{paired.ci[0]:.2f}, {paired.ci[1]:.2f}] "
              f"over the padded call ({paired.trial_ms:.1f} vs {paired.baseline_ms:.1f} ms), largest output change "
              f"{change:.2g}", flush=True)
    return {"model": spec.name, "batch": batch, "longest": int(lengths.max()),
            "mean_tokens": float(lengths.float().mean()), "rows": measured}


def recipe_call(recipe_path: Path, device: torch.device) -> tuple[Callable[..., Tensor], ModelSpec, Named]:
    """A recipe's prepared call (its runtime's), its spec, and what the result names it by."""
    recipe = Recipe.load(recipe_path)
    if recipe.model is None:
        raise SystemExit(f"error: {recipe_path} names no model: give a study's recipe.json")
    spec = resolve_spec(recipe.model)
    fn = replay(recipe, spec, device)
    if isinstance(fn, LengthGrouped):
        raise SystemExit(f"error: {recipe_path} has the pack stage: its {recipe.runtime} call is grouped already; "
                         "give the same recipe without pack to compare padded and grouped calls")
    return fn, spec, {"recipe": recipe.describe(brief=True), "runtime": recipe.runtime}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paretorch.experiments.bench.length_groups",
                                     description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--recipe", type=Path, help="a recipe file (runs/bench/best-minilm-cpu.json)")
    source.add_argument("--peer-ir", type=Path, help="a peer's OpenVINO IR .xml (MiniLM's token embeddings)")
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16], help="rows per length group")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    given = args.recipe or args.peer_ir
    if not given.is_file():
        parser.exit(2, f"error: {given} does not exist: give a study's recipe.json or a peer's .xml\n")
    torch.set_num_threads(args.threads)
    started = host_seconds()
    device = resolve_device(args.device)
    if args.recipe is not None:
        fn, spec, names = recipe_call(args.recipe, device)
    else:
        fn, spec = PlainIr(args.peer_ir, args.threads, None), resolve_spec("minilm")
        names = {"recipe": f"peer IR {args.peer_ir.name}", "runtime": "peer-openvino"}
    result: LengthGroupsResult = {**names, **measure(fn, spec, args.rows, args.batch, device),
                                  "threads": args.threads, "isa": isa_info(), "seconds": host_seconds() - started,
                                  "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{LENGTH_GROUPS_PREFIX}{result['model']}-{result['runtime']}-b{args.batch}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(f"written: {path}")
    return 0


def render(result: LengthGroupsResult) -> str:
    """A Markdown section of one length-groups file."""
    lines = [f"### Length-grouped calls: {result['model']} `{result['recipe']}`, batch {result['batch']}", "",
             f"`python -m paretorch.experiments.bench.length_groups` ({result['date']}, "
             f"{result['threads']} thread(s)): the "
             f"recipe's {result['runtime']} call on the latency batch ({result['longest']} tokens at the longest, "
             f"{result['mean_tokens']:.1f} on average), padded against grouped by length, paired in alternating "
             "rounds in one process. The product calls a pack recipe's file under onnxruntime and openvino in "
             "groups of 8 rows (pipeline/core/length_groups.py).",
             "", "| rows per group (calls) | speed-up over the padded call [95% CI] | p50 ms (grouped / padded) "
             "| largest output change |",
             "| --- | --- | --- | --- |"]
    for row in result["rows"]:
        speed = f"{row['speedup_over_padded']:.2f}x [{row['ci'][0]:.2f}, {row['ci'][1]:.2f}]"
        size = f"{row['rows_per_group']} ({row['groups']})" if "rows_per_group" in row else f"- ({row['groups']})"
        lines.append(f"| {size} | {speed} | {row['grouped_ms']:.1f} / {row['padded_ms']:.1f} | "
                     f"{row['max_abs_change']:.2g} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
