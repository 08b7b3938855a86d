"""The unoptimized model timed against a copy of itself, as the search pairs a trial with the baseline: the
speed-up must come out 1.0 within its 95% interval, and how long each ``--latency-budget`` takes.

    taskset -c 0 .venv/bin/python -m paretorch.experiments.bench.self_paired --model digits [--batch 32] [--threads 1]
        [--budgets quick,normal,thorough] [--repeats 3]

One line per budget and repeat: the speed-up [95% CI], whether the interval covers 1.0, the seconds the
measurement took (warm-up included) and the machine's load average; the same order alternation and the same
settings the search uses (:func:`paretorch.pipeline.core.paired.measure_paired`,
:data:`paretorch.pipeline.core.latency.LATENCY_BUDGETS`).
"""

from __future__ import annotations

import argparse
import copy
import os

import torch

from paretorch.pipeline.core.latency import LATENCY_BUDGETS
from paretorch.pipeline.core.padding import latency_inputs
from paretorch.pipeline.core.paired import measure_paired
from paretorch.pipeline.core.spec import load_model
from paretorch.pipeline.core.timing import DeviceTimer, host_seconds, process_clock
from paretorch.pipeline.sources.resolve import resolve_spec

CPU = torch.device("cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budgets", default=",".join(LATENCY_BUDGETS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    budgets = args.budgets.split(",")
    unknown = [b for b in budgets if b not in LATENCY_BUDGETS]
    if unknown:
        parser.error(f"--budgets: unknown {', '.join(unknown)}; choose from {', '.join(LATENCY_BUDGETS)}")
    torch.set_num_threads(args.threads)
    spec = resolve_spec(args.model)
    model = load_model(spec).eval()
    twin = copy.deepcopy(model)
    inputs = latency_inputs(spec, args.batch, "eager")[0]
    print(f"{spec.name}, batch {args.batch}, {args.threads} thread(s), cores {sorted(os.sched_getaffinity(0))}")
    for name in budgets:
        settings = LATENCY_BUDGETS[name]
        for _ in range(args.repeats):
            started = host_seconds()
            paired = measure_paired((model, inputs), (twin, inputs), DeviceTimer(CPU, settings), settings,
                                    cpu_clock=process_clock)
            seconds = host_seconds() - started
            low, high = paired.ci
            print(f"{name:9s} {paired.speedup:.3f}x [{low:.3f}, {high:.3f}] "
                  f"{'covers' if low <= 1.0 <= high else 'MISSES'} 1.0; {paired.rounds} rounds x "
                  f"{settings.round_runs} call(s), {paired.attempts} attempt(s), {seconds:.2f} s; "
                  f"{paired.machine.describe()}; baseline {paired.baseline_ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
