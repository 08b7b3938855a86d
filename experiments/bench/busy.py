"""The busy-machine check: the same digits search, quiet and beside a CPU-bound process.

``python -m paretorch.experiments.bench.busy [--trials 20]``: the search runs pinned to one core with one
thread, twice with the same sampler seed: once with the other cores idle (quiet), once with a
process spinning on another core (busy). It passes when both runs put the same recipes on the
front and every busy front speed-up (paired with the baseline during the search) lies within the
quiet run's 95 % interval of the same recipe. Results go to ``results/busy-<model>-cpu.json`` and
a section of BENCHMARKS.md, with the machine's load before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypedDict

import torch
from rich.console import Console

from paretorch.experiments.bench.paths import RESULTS_DIR
from paretorch.pipeline.core.timing import host_seconds
from paretorch.pipeline.search import Search, SearchConfig, run_search
from paretorch.pipeline.search.objectives import ATTR_METRICS, ATTR_RECIPE_LINE
from paretorch.pipeline.sources.resolve import resolve_spec

BUSY_PREFIX = "busy-"
SPIN = "while True: pass"


class FrontRow(TypedDict):
    """A front trial: its number, paired speed-up and 95% interval (None where not recorded)."""

    trial: int
    speedup: float
    ci: list[float | None]


class BusyFront(TypedDict):
    """One search's front as recipe -> row, its seconds and the 1-minute load before it."""

    front: dict[str, FrontRow]
    seconds: float
    load_before: float


class BusyVerdict(TypedDict):
    same_front: bool
    within_quiet_interval: dict[str, bool]
    passed: bool


class BusyResult(TypedDict):
    """A ``busy-*.json`` file."""

    model: str
    trials: int
    core: int
    busy_core: int
    machine: str
    quiet: BusyFront
    busy: BusyFront
    verdict: BusyVerdict


@contextmanager
def spinning(core: int) -> Iterator[int]:
    """A CPU-bound process pinned to ``core`` for the duration of the block (its pid)."""
    process = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.sched_setaffinity(process.pid, {core})
        yield process.pid
    finally:
        process.kill()
        process.wait()


def front(model: str, trials: int, storage: Path, label: str) -> BusyFront:
    """One search in a fresh study (the results folder's caches, trained weights included, are shared):
    its front as recipe -> speed-up and interval."""
    spec = resolve_spec(model)
    config = SearchConfig.load(None, exports="none")
    search = Search(spec, torch.device("cpu"), config, storage=f"sqlite:///{storage}", track=False,
                    name=f"busy-check-{model}-{label}-{int(time.time())}")
    started = host_seconds()
    outcome = run_search(search, trials, console=Console(stderr=True))
    rows: dict[str, FrontRow] = {}
    for trial in outcome.pareto:
        metrics = trial.user_attrs[ATTR_METRICS]
        recipe = str(trial.user_attrs.get(ATTR_RECIPE_LINE, trial.number)).partition(" | -> ")[0]
        rows[recipe] = {"trial": trial.number, "speedup": metrics.get("speedup"),
                        "ci": [metrics.get("speedup_ci_low"), metrics.get("speedup_ci_high")]}
    return {"front": rows, "seconds": host_seconds() - started, "load_before": os.getloadavg()[0]}


def verdict(quiet: BusyFront, busy: BusyFront) -> BusyVerdict:
    """Same recipes on both fronts, and each busy speed-up inside the quiet interval of its recipe."""
    same = set(quiet["front"]) == set(busy["front"])
    inside: dict[str, bool] = {}
    for recipe, row in busy["front"].items():
        quiet_row = quiet["front"].get(recipe)
        low, high = quiet_row["ci"] if quiet_row else (None, None)
        inside[recipe] = low is not None and high is not None and low <= row["speedup"] <= high
    return {"same_front": same, "within_quiet_interval": inside, "passed": same and all(inside.values())}


def render(result: BusyResult) -> str:
    lines = [f"## Busy-machine check: {result['model']} on CPU ({result['trials']} trials, one thread pinned to core "
             f"{result['core']}; busy = a spinning process on core {result['busy_core']})", "",
             f"Machine: {result['machine']}; load before the quiet run {result['quiet']['load_before']:.2f}, "
             f"before the busy run {result['busy']['load_before']:.2f}. "
             f"**{'passed' if result['verdict']['passed'] else 'failed'}**: same front "
             f"{result['verdict']['same_front']}.", "",
             "| recipe | quiet speed-up [95% CI] | busy speed-up | inside |", "| --- | --- | --- | --- |"]
    for recipe in sorted(set(result["quiet"]["front"]) | set(result["busy"]["front"])):
        quiet, busy = result["quiet"]["front"].get(recipe), result["busy"]["front"].get(recipe)
        quiet_text = f"{quiet['speedup']:.2f}x [{quiet['ci'][0]:.2f}, {quiet['ci'][1]:.2f}]" if quiet else "-"
        busy_text = f"{busy['speedup']:.2f}x" if busy else "-"
        inside = result["verdict"]["within_quiet_interval"].get(recipe)
        lines.append(f"| {recipe} | {quiet_text} | {busy_text} | {'yes' if inside else 'no' if busy else '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paretorch.experiments.bench.busy",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="digits")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        print("error: the busy-machine check needs 2 cores (one for the search, one for the load)", file=sys.stderr)
        return 2
    core, busy_core = cores[0], cores[1]
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        quiet = front(args.model, args.trials, Path(tmp) / "quiet.db", "quiet")
        with spinning(busy_core):
            time.sleep(2.0)  # let the load average see it
            busy = front(args.model, args.trials, Path(tmp) / "busy.db", "busy")
    result: BusyResult = {"model": args.model, "trials": args.trials, "core": core, "busy_core": busy_core,
                          "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
                                     f"{torch.__version__}", "quiet": quiet, "busy": busy,
                          "verdict": verdict(quiet, busy)}
    path = args.out / f"{BUSY_PREFIX}{args.model}-cpu.json"
    path.write_text(json.dumps(result, indent=2))
    print(render(result))
    return 0  # a miss is a finding written to BENCHMARKS.md, not a failed command


if __name__ == "__main__":
    raise SystemExit(main())
