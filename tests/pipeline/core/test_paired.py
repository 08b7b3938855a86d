"""Paired latency on fake clocks: ratios survive a busy period, wide intervals are retried, then flagged."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch

from pipeline.core.paired import ROUNDS, free_cores, measure_paired, noise_line
from pipeline.core.spec import Batch

INPUTS: Batch = (torch.zeros(1, 4),)


def baseline(x: torch.Tensor) -> torch.Tensor:
    return x


def trial(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def fake_timer(times: Callable[[Callable[..., torch.Tensor], int], float]
               ) -> Callable[[Sequence[Callable[..., torch.Tensor]], Batch], list[float]]:
    """A round timer from ``times(fn, round index)``: no clock, no sleeping."""
    rounds = itertools.count()

    def time_round(functions: Sequence[Callable[..., torch.Tensor]], inputs: Batch) -> list[float]:
        index = next(rounds)
        return [times(fn, index) for fn in functions]

    return time_round


def fixed_cpu(share: float) -> Callable[[], tuple[float, float]]:
    """A process clock where the process runs ``share`` of each wall second."""
    ticks: Iterator[int] = itertools.count()

    def clock() -> tuple[float, float]:
        tick = next(ticks)
        return float(tick), share * tick

    return clock


def test_a_busy_period_slows_both_sides_and_leaves_the_ratio() -> None:
    # rounds 3..5 run while another job holds the cores: everything 10x slower
    timer = fake_timer(lambda fn, i: (1.0 if fn is baseline else 0.5) * (10.0 if 3 <= i <= 5 else 1.0))
    paired = measure_paired(baseline, trial, INPUTS, timer, cpu_clock=fixed_cpu(0.4))
    assert paired.speedup == pytest.approx(2.0) and paired.ci == pytest.approx((2.0, 2.0))
    assert paired.attempts == 1 and paired.unstable is None and paired.rounds == ROUNDS
    assert paired.trial_ms == pytest.approx(0.5) and paired.machine.cpu_share == pytest.approx(0.4)
    metrics = paired.metrics()
    assert metrics["speedup"] == pytest.approx(2.0) and metrics["speedup_ci_width_pct"] == 0.0
    assert metrics["latency_ms_paired"] == pytest.approx(0.5) and metrics["baseline_latency_ms_paired"] == 1.0


def test_a_wide_interval_is_measured_again_then_called_unstable() -> None:
    wild = itertools.cycle([0.1, 2.0, 0.2, 1.5, 0.15, 3.0, 0.3, 0.12, 2.5])
    timer = fake_timer(lambda fn, i: 1.0 if fn is baseline else next(wild))
    paired = measure_paired(baseline, trial, INPUTS, timer, cpu_clock=None)
    assert paired.attempts == 3 and paired.unstable is not None
    assert paired.unstable.startswith("speed-up 95% CI [0.40, 8.33] is ")
    assert "in each of 3 measurements" in paired.unstable and "core(s)" in paired.unstable
    assert paired.machine.cpu_share is None


def test_a_retry_that_settles_is_kept() -> None:
    calls = itertools.count()
    # first attempt (9 rounds) noisy, then steady
    noisy = itertools.cycle([0.1, 2.0, 0.2, 1.5, 0.15, 3.0, 0.3, 0.12, 2.5])
    timer = fake_timer(lambda fn, i: 1.0 if fn is baseline else (next(noisy) if next(calls) < ROUNDS else 0.25))
    paired = measure_paired(baseline, trial, INPUTS, timer, cpu_clock=None)
    assert paired.attempts == 2 and paired.unstable is None and paired.speedup == pytest.approx(4.0)


def test_free_cores_leave_room_for_other_work() -> None:
    assert free_cores(load=0.2, cores=2) == 2
    assert free_cores(load=1.0, cores=2) == 1
    assert free_cores(load=3.3, cores=2) == 1, "at least one"
    assert free_cores(load=5.6, cores=16) == 10


def test_the_noise_line_sums_up_the_study() -> None:
    trials = [{"speedup_ci_width_pct": 4.0, "machine_load": 3.1, "machine_cores": 2.0, "latency_attempts": 1.0},
              {"speedup_ci_width_pct": 30.0, "machine_load": 3.5, "machine_cores": 2.0, "latency_attempts": 3.0},
              {"speedup_ci_width_pct": 2.0, "machine_load": 2.0, "machine_cores": 2.0, "latency_attempts": 2.0},
              {"accuracy": 0.9}]  # a trial from before paired latency: not counted
    assert noise_line(trials, unstable=1) == (
        "machine: load 3.1 on 2 core(s) during the study; median paired-ratio CI width 4% over 3 trial(s); "
        "2 trial(s) re-measured, 1 kept off the front (latency unstable)")
    assert noise_line([{"accuracy": 0.9}], unstable=0) is None
