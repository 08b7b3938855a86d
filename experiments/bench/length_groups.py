"""Length-grouped calls of an exported model: what packing could buy OpenVINO and ONNX Runtime (not in the product).

    taskset -c 1 python -m experiments.bench.length_groups --recipe runs/bench/best-minilm-cpu.json [--groups 2 4 8]

A padded batch computes every padding token: MiniLM's latency batch (32 sentences, 61 tokens at the longest, 32.2
on average) is half padding. torch's ``pack`` stage drops it inside the model (varlen attention), which an exported
graph cannot. The same saving is open to any runtime at the *call*: sort the batch's rows by length, cut them into
``k`` groups, trim each group to its own longest row and call the model once per group, the outputs put back in the
rows' order (per-row outputs only: a pooled embedding). Padding is masked, so outputs change only by the kernels'
rounding at other shapes. This bench replays a recipe with the engine's runner (its runtime's prepared call: an
OpenVINO or ONNX Runtime session), and times the plain padded call against the grouped one, paired in alternating
rounds in one process (:func:`pipeline.core.paired.measure_paired`), on the latency batch the search times. The
product does not do this yet: a recipe's deployable call would have to group the same way.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from experiments.bench.isa import isa_info
from experiments.bench.paths import RESULTS_DIR
from experiments.bench.recipe_rows import replay
from experiments.bench.settings import BENCH_LATENCY
from pipeline.core.device import resolve_device
from pipeline.core.padding import cut_to, latency_sample, longest, trim_to_longest
from pipeline.core.paired import DeviceTimer, measure_paired, process_clock
from pipeline.engine.recipe import Recipe
from pipeline.sources.resolve import resolve_spec

LENGTH_GROUPS_PREFIX = "length-groups-"


def grouped_call(fn: Callable[..., Tensor], groups: int, mask_index: int) -> Callable[..., Tensor]:
    """``fn`` called once per group of rows of similar length, each group trimmed to its own longest row; the
    per-row outputs are put back in the batch's order."""

    def call(*inputs: Tensor) -> Tensor:
        lengths = inputs[mask_index].ne(0).sum(dim=1)
        order = torch.argsort(lengths, stable=True)
        parts: list[Tensor] = []
        for rows in torch.tensor_split(order, groups):
            group = tuple(t[rows] for t in inputs)
            parts.append(fn(*cut_to(group, longest(group, mask_index), mask_index)))
        out = torch.cat(parts)
        return out[torch.argsort(order)]

    return call


def measure(recipe_path: Path, groups: Sequence[int], batch: int, device_name: str) -> dict[str, Any]:
    """The recipe's prepared call, padded and grouped: paired speed-up of each grouping and its largest output
    change."""
    recipe = Recipe.load(recipe_path)
    if recipe.model is None:
        raise SystemExit(f"error: {recipe_path} names no model: give a study's recipe.json")
    spec = resolve_spec(recipe.model)
    if spec.padding_mask is None:
        raise SystemExit(f"error: {spec.name} takes no padding mask: length groups do not apply")
    device = resolve_device(device_name)
    fn = replay(recipe, spec, device)
    inputs = trim_to_longest(latency_sample(spec, batch), spec.padding_mask)
    lengths = inputs[spec.padding_mask].ne(0).sum(dim=1)
    timer = DeviceTimer(device, BENCH_LATENCY)
    with torch.no_grad():
        padded = fn(*inputs)
    rows = []
    for k in groups:
        call = grouped_call(fn, k, spec.padding_mask)
        with torch.no_grad():
            change = float((call(*inputs) - padded).abs().max())
        paired = measure_paired((fn, inputs), (call, inputs), timer, BENCH_LATENCY, cpu_clock=process_clock)
        rows.append({"groups": k, "speedup_over_padded": paired.speedup, "ci": list(paired.ci),
                     "grouped_ms": paired.trial_ms, "padded_ms": paired.baseline_ms, "max_abs_change": change,
                     "unstable": paired.unstable, "machine": paired.machine.describe()})
        print(f"{k} groups: {paired.speedup:.2f}x [{paired.ci[0]:.2f}, {paired.ci[1]:.2f}] over the padded call "
              f"({paired.trial_ms:.1f} vs {paired.baseline_ms:.1f} ms), largest output change {change:.2g}", flush=True)
    return {"recipe": recipe.describe(brief=True), "runtime": recipe.runtime, "model": spec.name, "batch": batch,
            "longest": int(lengths.max()), "mean_tokens": float(lengths.float().mean()), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench.length_groups",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, required=True, help="a recipe file (runs/bench/best-minilm-cpu.json)")
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not args.recipe.is_file():
        parser.exit(2, f"error: --recipe {args.recipe} does not exist: give a study's recipe.json\n")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result = measure(args.recipe, args.groups, args.batch, args.device)
    result |= {"threads": args.threads, "isa": isa_info(), "seconds": time.perf_counter() - started,
               "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{LENGTH_GROUPS_PREFIX}{result['model']}-{result['runtime']}-b{args.batch}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(f"written: {path}")
    return 0


def render(result: dict[str, Any]) -> str:
    """A Markdown section of one length-groups file."""
    lines = [f"### Length-grouped calls: {result['model']} `{result['recipe']}`, batch {result['batch']}", "",
             f"`python -m experiments.bench.length_groups` ({result['date']}, {result['threads']} thread(s)): the "
             f"recipe's {result['runtime']} call on the latency batch ({result['longest']} tokens at the longest, "
             f"{result['mean_tokens']:.1f} on average), padded against grouped by length, paired in alternating "
             "rounds in one process. Not in the product yet: a measurement of what packing could buy this runtime.",
             "", "| groups | speed-up over the padded call [95% CI] | p50 ms (grouped / padded) "
             "| largest output change |",
             "| --- | --- | --- | --- |"]
    for row in result["rows"]:
        speed = f"{row['speedup_over_padded']:.2f}x [{row['ci'][0]:.2f}, {row['ci'][1]:.2f}]"
        lines.append(f"| {row['groups']} | {speed} | {row['grouped_ms']:.1f} / {row['padded_ms']:.1f} | "
                     f"{row['max_abs_change']:.2g} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
