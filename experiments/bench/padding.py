"""MiniLM fp32 eager latency on the CPU at the old inputs (every sentence padded to 128 tokens)
against the new ones (the batch padded to its longest sentence), interleaved in one process.

    .venv/bin/python -m paretorch.experiments.bench.padding [--batch 32] [--rounds 7] [--threads 1]

Timed on the timing service (:func:`paretorch.pipeline.core.timing.time_rounds`: the order reversed every other round).
Prints one line per round and the medians, with the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from paretorch.experiments.models.minilm import spec as minilm_spec
from paretorch.pipeline.core.latency import LatencySettings
from paretorch.pipeline.core.noise import median_ci
from paretorch.pipeline.core.padding import latency_inputs, pad_to
from paretorch.pipeline.core.spec import load_model
from paretorch.pipeline.core.timing import DeviceTimer, time_rounds
from paretorch.pipeline.sources.huggingface import SEQUENCE_LENGTH

CPU = torch.device("cpu")
#: Per round each side's median of 5 calls (the timing service's rounds, each side warmed up once by 2 calls).
ROUND = LatencySettings(warmup_runs=2, round_runs=5, round_seconds=0.0)


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = minilm_spec()
    model = load_model(spec)
    trimmed, lengths = latency_inputs(spec, args.batch, "eager")
    assert lengths is not None and spec.padding_mask is not None
    padded = pad_to(trimmed, SEQUENCE_LENGTH, spec.padding_mask)
    print(f"MiniLM fp32 eager, CPU, {args.threads} thread(s), batch {args.batch}: longest {lengths.length} tokens, "
          f"mean {lengths.mean_tokens:.1f}; load average before: {load_average()}")
    sides = [(model, padded), (model, trimmed)]
    timer = DeviceTimer(CPU, ROUND)
    with torch.inference_mode():
        timer.warm_up(sides)
        timed = time_rounds(sides, timer, args.rounds)  # the order reversed every other round
    samples = dict(zip(("padded to 128", f"trimmed to {lengths.length}"), timed, strict=True))
    for round_index, times in enumerate(zip(*timed, strict=True)):
        print(f"round {round_index + 1}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in zip(samples, times, strict=True)))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name, values in samples.items():
        low, high = median_ci(sorted(values))
        print(f"{name}: median {medians[name]:.1f} ms (95% CI {low:.1f}-{high:.1f}, {len(values)} rounds)")
    old, new = medians.values()
    print(f"ratio {old / new:.2f}x; load average after: {load_average()}")


if __name__ == "__main__":
    main()
