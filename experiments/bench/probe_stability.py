"""The machine probe run again and again on one machine: the preset order it gives must be the same each time.

    taskset -c 1 .venv/bin/python -m paretorch.experiments.bench.probe_stability --device cpu --threads 1 --repeats 10 \
        --out experiments/bench/results/probe-stability-cpu.json

Each repeat runs :func:`paretorch.pipeline.core.machine_probe.probe_machine` over the runtimes available on the device
(their declared probes, as a study does) and orders the default search config's presets with it
(:func:`paretorch.pipeline.search.presets.preset_seeds`; a pair the probe drops is left out, as the study drops it). The
JSON holds each repeat's gains, ranges, seconds and preset order, the distinct orders, the ISA, the threads and
the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial
from pathlib import Path
from typing import TypedDict

import torch

from paretorch.experiments.bench.isa import IsaInfo, isa_info
from paretorch.pipeline.core.machine_probe import probe_machine, probe_reason
from paretorch.pipeline.core.runtimes.registry import available_runtimes, declared_probes
from paretorch.pipeline.search.config import SearchConfig
from paretorch.pipeline.search.presets import preset_seeds

#: Result files of this benchmark start with this (BENCHMARKS.md renders them: :func:`render`).
PROBE_STABILITY_PREFIX = "probe-stability-"


class ProbeRepeat(TypedDict):
    """One probe: per engine and precision its median speed against fp32 and range, its seconds, and the preset
    order it gives (the first seeds, every seed, the presets dropped)."""

    gains: dict[str, dict[str, float]]
    spreads: dict[str, dict[str, list[float]]]
    seconds: float
    first: list[str]
    order: list[str]
    dropped: list[str]


class ProbeStabilityResult(TypedDict):
    """A ``probe-stability-*.json`` file."""

    device: str
    device_name: str
    isa: IsaInfo
    threads: int
    runtimes: list[str]
    torch: str
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    repeats: list[ProbeRepeat]
    distinct_orders: int
    same_order_every_time: bool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    runtimes = available_runtimes(device)
    presets = SearchConfig.load().presets
    load_before = os.getloadavg()
    repeats: list[ProbeRepeat] = []
    for index in range(args.repeats):
        probe = probe_machine(device, *declared_probes(runtimes, device))
        plan = preset_seeds(presets, runtimes, partial(probe_reason, probe), probe)
        first = [s.name for s in plan.seeds]
        repeats.append({"gains": probe.gains, "spreads": probe.spreads, "seconds": round(probe.seconds, 2),
                        "first": first, "order": [*first, *(s.name for s in plan.later)],
                        "dropped": sorted(plan.skipped)})
        print(f"[{index + 1}/{args.repeats}] {probe.describe()}\n    first: {', '.join(first)}")
    orders = sorted({json.dumps(r["order"]) for r in repeats})
    result: ProbeStabilityResult = {
        "device": str(device), "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "",
        "isa": isa_info(), "threads": args.threads, "runtimes": runtimes, "torch": torch.__version__,
        "load_before": load_before, "load_after": os.getloadavg(), "repeats": repeats,
        "distinct_orders": len(orders), "same_order_every_time": len(orders) == 1}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(orders)} distinct preset order(s) in {args.repeats} repeats -> {args.out}")


def render(result: ProbeStabilityResult) -> str:
    """The BENCHMARKS.md section of one result: per engine and precision, the medians' range over the repeats,
    and whether every repeat gave the same preset order."""
    repeats = result["repeats"]
    where = result["device_name"] or f"{result['device']} ({result['isa'].get('torch_capability', '?')})"
    lines = [f"### The machine probe, {len(repeats)} times on {where}, {result['threads']} thread(s)", "",
             f"torch {result['torch']}; load average before {result['load_before'][0]:.2f}, after "
             f"{result['load_after'][0]:.2f}; runtimes {', '.join(result['runtimes'])}. "
             f"**{result['distinct_orders']} distinct preset order(s)**; first: {', '.join(repeats[0]['first'])}.", "",
             "| engine | precision | median speed vs fp32 (lowest - highest of the repeats) | widest range |",
             "| --- | --- | --- | --- |"]
    for engine, gains in repeats[0]["gains"].items():
        for precision in gains:
            medians = [r["gains"][engine][precision] for r in repeats]
            widest = max(repeats, key=lambda r: r["spreads"][engine][precision][1] - r["spreads"][engine][precision][0])
            low, high = widest["spreads"][engine][precision]
            lines.append(f"| {engine} | {precision} | {min(medians):.2f}x - {max(medians):.2f}x | "
                         f"[{low:.2f}, {high:.2f}] |")
    seconds = [r["seconds"] for r in repeats]
    lines += ["", f"Each probe took {min(seconds):.1f}-{max(seconds):.1f} s."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
