"""The one timing service (pipeline/core/timing.py): one clock per device, read by every timed path.

* Contract: no code outside the service reads a clock for a latency, waits for a device, or makes a device event
  (an AST scan of every package); ``perf_counter`` is allowed, outside it, only in the files listed below, each for
  a wall time that is no latency (a progress line, a wall-time split, a deadline), and each entry must still be needed.
* On an injected clock (:class:`tests.fake_clock.SimulatedClock`, no sleeping, no timed assertion): a callable timed
  alone gives the percentiles of its known call times, and the machine probe and a trial's paired timing read the
  one clock object of the device.
"""

from __future__ import annotations

import ast
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from paretorch.pipeline.core.latency import LATENCY_BUDGETS, LatencySettings, default_latency
from paretorch.pipeline.core.machine_probe import paired_gain
from paretorch.pipeline.core.names import DEFAULT_LATENCY_BUDGET
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.timing import HostClock, clock_for, measure_latency, use_clock
from paretorch.pipeline.search.study_latency import StudyLatency
from tests.fake_clock import SimulatedClock

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("paretorch", "pipeline", "stages", "experiments", "plugins")
SERVICE = "pipeline/core/timing.py"
CPU = torch.device("cpu")
#: A spec to time, never to score.
TINY = ModelSpec(name="tiny", build=nn.Identity, example_inputs=lambda n: (torch.zeros(n, 2),), calibration=list,
                 evaluation=list, metric=None)  # type: ignore[arg-type]
#: Reading a latency clock, timing on a device, waiting for one: the service's alone (``time.monotonic`` is the
#: deadline clock: a timeout, a heartbeat, a costly step's seconds, never a latency).
CLOCK_CALLS = {"perf_counter", "perf_counter_ns", "process_time", "synchronize", "elapsed_time", "Stopwatch"}
#: Files that read ``perf_counter`` for a wall time that is no latency, and why.
WALL_TIME = {
    "paretorch/__main__.py": "the command's own wall time, from its start (its time: line)",
    "pipeline/cli/main.py": "the command's own wall time (its time: line)",
    "pipeline/cli/commands.py": "the command's own wall time (its time: line)",
    "pipeline/search/loop.py": "the search's wall time and its split",
    "pipeline/search/trial_objective.py": "a trial's wall-time split (stages, evaluation, paired latency)",
    "pipeline/search/trial_steps.py": "a trial's wall-time split (stages, evaluation, paired latency)",
    "pipeline/search/screening.py": "the wall seconds of a costly stage (the costly-share deadline)",
    "pipeline/engine/runner.py": "a run's wall-time split by category (stages, evaluation, exports, sessions)",
    "pipeline/engine/exported.py": "the wall seconds of an export (the exports category)",
    "pipeline/core/ort_session.py": "the seconds an ONNX Runtime session takes to open (runtime_sessions)",
    "pipeline/core/ov_session.py": "the seconds an OpenVINO model takes to compile (runtime_sessions)",
    "plugins/mlx/paretorch_mlx/runtime.py": "the seconds an MLX model takes to build (runtime_sessions)",
    "pipeline/core/self_check.py": "the self-check's wall seconds on its console line",
    "pipeline/core/machine_probe.py": "the probe's wall seconds on its console line (its rounds: paired_gain, here)",
    "pipeline/core/progress.py": "progress lines (elapsed seconds)",
    "stages/distill/loop.py": "distillation's deadline (max_seconds)",
    "experiments/bench/peers_runner.py": "runs in a peer's own interpreter without paretorch: the peers' protocol",
}


def source_files() -> Iterator[Path]:
    """Every Python file of the packages, each once (paretorch/pipeline and the like are links to the folders)."""
    for package in PACKAGES:
        for folder, dirs, files in os.walk(REPO / package, followlinks=False):
            dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink() and d != "__pycache__"]
            yield from (Path(folder) / name for name in files if name.endswith(".py"))


def clock_reads(path: Path) -> set[str]:
    """The clock, event and device-wait names ``path``'s code uses (not its docstrings): attributes, names and
    imported names; ``torch.Event`` and ``torch.<device>.Event`` as ``Event``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            if node.attr in CLOCK_CALLS:
                found.add(node.attr)
            if node.attr == "Event" and "torch" in ast.unparse(node.value):
                found.add("Event")
        elif isinstance(node, ast.Name) and node.id in CLOCK_CALLS:
            found.add(node.id)
        elif isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names if alias.name in CLOCK_CALLS)
    return found


def test_only_the_timing_service_reads_a_clock_for_a_latency() -> None:
    reads = {path.relative_to(REPO).as_posix(): clock_reads(path) for path in source_files()}
    assert {"perf_counter_ns", "Event", "synchronize", "elapsed_time"} <= reads[SERVICE], "the scan sees the service"
    outside = {name: found for name, found in reads.items() if found and name != SERVICE}
    wrong = {name: sorted(found - ({"perf_counter"} if name in WALL_TIME else set()))
             for name, found in outside.items()}
    wrong = {name: found for name, found in wrong.items() if found}
    assert not wrong, f"time through paretorch.pipeline.core.timing (or list a wall time in WALL_TIME): {wrong}"
    stale = sorted(name for name in WALL_TIME if "perf_counter" not in reads.get(name, set()))
    assert not stale, f"no longer read perf_counter, remove from WALL_TIME: {stale}"


def test_each_device_has_one_clock_and_a_test_may_swap_it() -> None:
    assert isinstance(clock_for(CPU), HostClock) and clock_for(CPU) is clock_for(torch.device("cpu"))
    real = clock_for(CPU)
    region = real.region()
    torch.randn(128, 128) @ torch.randn(128, 128)
    region.stop()
    assert region.ms() > 0
    with use_clock(CPU, SimulatedClock()) as fake:
        assert clock_for(CPU) is fake
    assert clock_for(CPU) is real, "restored after the block"


def test_no_budget_given_is_the_default_budget() -> None:
    assert LatencySettings() == default_latency() == LATENCY_BUDGETS[DEFAULT_LATENCY_BUDGET]


def advancing(clock: SimulatedClock, ms: Callable[[], float]) -> Callable[..., torch.Tensor]:
    """A model whose every call lasts ``ms()`` simulated milliseconds."""
    def call(*inputs: torch.Tensor) -> torch.Tensor:
        clock.advance(ms())
        return torch.zeros(1)
    return call


def test_a_callable_timed_alone_reads_its_devices_clock() -> None:
    """The first call apart, the warm-up untimed, then the timed calls' percentiles: known times in, known out."""
    times = itertools.chain([50.0, 9.0, 9.0], itertools.cycle([1.0, 2.0, 3.0, 4.0, 5.0]))
    settings = LatencySettings(warmup_runs=2, min_runs=10, min_seconds=0.0)
    with use_clock(CPU, SimulatedClock()) as clock:
        stats = measure_latency(advancing(clock, lambda: next(times)), (torch.zeros(4, 2),), CPU, settings)
    assert stats.first_call_ms == 50.0 and stats.runs == 10 and stats.batch_size == 4
    assert (stats.min_ms, stats.p50_ms, stats.p90_ms) == (1.0, 3.0, 5.0), "the warm-up's 9 ms calls are not timed"


def test_the_probe_and_a_trials_paired_timing_read_the_same_clock() -> None:
    """The machine probe (a precision against float32) and a trial paired with the baseline, on the CPU's one
    clock swapped for a simulated one: both read that object, and their ratios are the simulated times'."""
    settings = LatencySettings(warmup_runs=1, min_runs=1, min_seconds=0.0, rounds=4, round_runs=1, round_seconds=0.0)
    with use_clock(CPU, SimulatedClock()) as clock:
        gain = paired_gain(advancing(clock, lambda: 4.0), advancing(clock, lambda: 1.0), CPU)
        probe_regions = clock.regions
        baseline = advancing(clock, lambda: 2.0)
        runner = SimpleNamespace(prepare=lambda configs, runtime: baseline)
        latency = StudyLatency(TINY, CPU, 8, lambda: runner, settings)  # type: ignore[arg-type, return-value]
        latency.cpu_clock = None
        paired = latency.pair(advancing(clock, lambda: 1.0), "eager")
    assert probe_regions > 0 and gain.ratio == pytest.approx(4.0) and gain.decided() is True
    assert clock.regions - probe_regions == 2 * paired.rounds, "one region per side per round, on the same clock"
    assert paired.speedup == pytest.approx(2.0) and paired.trial_ms == 1.0 and paired.baseline_ms == 2.0
