"""Paired latency on fake clocks: ratios survive a busy period, wide intervals are retried, then flagged; the
order alternates, so whatever the first place in a round costs lands on both sides alike."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch

from paretorch.pipeline.core.latency import LATENCY_BUDGETS, LatencySettings
from paretorch.pipeline.core.paired import (
    UNSTABLE_ADVICE,
    StopRule,
    Timed,
    free_cores,
    measure_paired,
    noise_line,
)
from paretorch.pipeline.core.spec import Batch
from paretorch.pipeline.core.timing import DeviceTimer, round_order, time_rounds

INPUTS: Batch = (torch.zeros(1, 4),)
SETTINGS = LATENCY_BUDGETS["normal"]
ROUNDS = SETTINGS.rounds


def baseline(x: torch.Tensor) -> torch.Tensor:
    return x


def trial(x: torch.Tensor) -> torch.Tensor:
    return x + 1


class FakeTimer:
    """A round timer from ``times(fn, round index, place in the round)``: no clock, no sleeping. Records the
    order each round ran in."""

    def __init__(self, times: Callable[[Callable[..., torch.Tensor], int, int], float]) -> None:
        self.times = times
        self.rounds = itertools.count()
        self.orders: list[list[Callable[..., torch.Tensor]]] = []
        self.warmed: list[Callable[..., torch.Tensor]] = []

    def warm_up(self, sides: Sequence[Timed]) -> None:
        self.warmed.extend(fn for fn, _ in sides)

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        index = next(self.rounds)
        self.orders.append([fn for fn, _ in sides])
        return [self.times(fn, index, place) for place, (fn, _) in enumerate(sides)]


def fake_timer(times: Callable[[Callable[..., torch.Tensor], int], float]) -> FakeTimer:
    """A fake timer whose times do not depend on the order."""
    return FakeTimer(lambda fn, index, place: times(fn, index))


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
    paired = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=fixed_cpu(0.4))
    assert paired.speedup == pytest.approx(2.0) and paired.ci == pytest.approx((2.0, 2.0))
    assert paired.attempts == 1 and paired.unstable is None and paired.rounds == ROUNDS
    assert paired.trial_ms == pytest.approx(0.5) and paired.machine.cpu_share == pytest.approx(0.4)
    metrics = paired.metrics()
    assert metrics["speedup"] == pytest.approx(2.0) and metrics["speedup_ci_width_pct"] == 0.0
    assert metrics["latency_ms_paired"] == pytest.approx(0.5) and metrics["baseline_latency_ms_paired"] == 1.0


def test_a_wide_interval_is_measured_again_then_called_unstable() -> None:
    wild = itertools.cycle([0.1, 2.0, 0.2, 1.5, 0.15, 3.0, 0.3, 0.12, 2.5, 0.2])
    timer = fake_timer(lambda fn, i: 1.0 if fn is baseline else next(wild))
    paired = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None)
    assert paired.attempts == 3 and paired.unstable is not None
    assert paired.unstable.startswith("speed-up 95% CI [0.67, 5.00] is ")
    assert "over 30 rounds (round limit)" in paired.unstable and "core(s)" in paired.unstable
    assert paired.rounds == 3 * ROUNDS, "the interval is over every round, never the narrowest block's"
    assert paired.machine.cpu_share is None


def test_a_retry_that_settles_is_kept() -> None:
    calls = itertools.count()
    # first attempt (its rounds) noisy, then steady
    noisy = itertools.cycle([0.1, 2.0, 0.2, 1.5, 0.15, 3.0, 0.3, 0.12, 2.5, 0.2])
    timer = fake_timer(lambda fn, i: 1.0 if fn is baseline else (next(noisy) if next(calls) < ROUNDS else 0.25))
    paired = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None)
    assert paired.attempts == 2 and paired.unstable is None and paired.speedup == pytest.approx(4.0)


def first_costs(penalty: float, true_ms: Callable[[Callable[..., torch.Tensor]], float]) -> FakeTimer:
    """A clock where the side that runs first in a round pays ``penalty`` (a share of its time) more."""
    return FakeTimer(lambda fn, index, place: true_ms(fn) * (1.0 + penalty if place == 0 else 1.0))


def test_the_order_alternates_so_a_model_timed_against_itself_covers_one() -> None:
    timer = first_costs(0.05, lambda fn: 1.0)
    same = measure_paired((baseline, INPUTS), (baseline, INPUTS), timer, SETTINGS, cpu_clock=None)
    assert same.ci[0] <= 1.0 <= same.ci[1], f"{same.speedup:.3f}x [{same.ci[0]:.3f}, {same.ci[1]:.3f}]"
    assert same.speedup == pytest.approx(1.0, abs=0.002), "the first place's cost lands on both sides alike"
    firsts = [order[0] for order in timer.orders]
    assert len(firsts) == ROUNDS and firsts[::2] == [baseline] * (ROUNDS // 2), "baseline first in even rounds"
    # a trial that costs the same: the interval covers 1.0; one that is 2x faster: 2x within its interval
    timer = first_costs(0.05, lambda fn: 1.0 if fn is baseline else 0.5)
    faster = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None)
    assert faster.ci[0] <= 2.0 <= faster.ci[1] and faster.speedup == pytest.approx(2.0, rel=0.003)


def test_a_fixed_order_would_have_missed_one() -> None:
    """What the alternation fixes: the same clock, timed baseline first in every round, excludes 1.0."""
    timer = first_costs(0.05, lambda fn: 1.0)
    fixed = [timer([(baseline, INPUTS), (trial, INPUTS)]) for _ in range(ROUNDS)]
    ratios = sorted(b / t for b, t in fixed)
    assert ratios[1] > 1.0, "every round's ratio is 1.05: the interval [x(1), x(8)] excludes 1.0"
    alternating = time_rounds([(baseline, INPUTS), (trial, INPUTS)], first_costs(0.05, lambda fn: 1.0), ROUNDS)
    assert sorted(b / t for b, t in zip(*alternating, strict=True))[1] < 1.0 < max(
        b / t for b, t in zip(*alternating, strict=True))


def test_the_order_of_several_models_reverses_every_other_round() -> None:
    assert [round_order(3, i) for i in range(4)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2], [2, 1, 0]]
    mean_place = [sum(round_order(3, i).index(k) for i in range(ROUNDS)) / ROUNDS for k in range(3)]
    assert mean_place == [1.0, 1.0, 1.0]


def test_each_side_is_warmed_up_once_per_measurement_not_per_round() -> None:
    timer = fake_timer(lambda fn, i: 1.0 if fn is baseline else 0.5)
    measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None)
    assert timer.warmed == [baseline, trial] and len(timer.orders) == ROUNDS


def test_the_real_clock_times_the_rounds_the_budget_asks_for() -> None:
    """A real model on the real clock: calls counted per side, warm-up once, then round_runs calls a round."""
    calls = {"baseline": 0, "trial": 0}

    def counted(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        def fn(x: torch.Tensor) -> torch.Tensor:
            calls[name] += 1
            return x * 2
        return fn

    settings = LatencySettings(warmup_runs=2, rounds=4, round_runs=3, round_seconds=0.0)
    timer = DeviceTimer(torch.device("cpu"), settings)
    result = measure_paired((counted("baseline"), INPUTS), (counted("trial"), INPUTS), timer, settings,
                            max_width=float("inf"), cpu_clock=None)
    assert calls == {"baseline": 2 + 4 * 3, "trial": 2 + 4 * 3} and result.rounds == 4
    assert result.speedup > 0 and result.baseline_ms > 0


def test_a_slow_side_is_warmed_up_and_timed_on_fewer_calls() -> None:
    """Past the call cap a side's warm-up and each of its rounds stop at the call that crossed it (one call here,
    each sleeping past the cap); the fast side keeps the budget's calls."""
    calls = {"baseline": 0, "trial": 0}

    def fast(x: torch.Tensor) -> torch.Tensor:
        calls["baseline"] += 1
        return x * 2

    def slow(x: torch.Tensor) -> torch.Tensor:
        calls["trial"] += 1
        time.sleep(0.02)
        return x * 2

    settings = LatencySettings(warmup_runs=2, rounds=4, round_runs=3, round_seconds=0.0, call_cap_seconds=0.01)
    timer = DeviceTimer(torch.device("cpu"), settings)
    result = measure_paired((fast, INPUTS), (slow, INPUTS), timer, settings, max_width=float("inf"), cpu_clock=None)
    assert calls == {"baseline": 2 + 4 * 3, "trial": 1 + 4 * 1} and result.rounds == 4
    assert result.speedup < 1.0


@pytest.mark.parametrize("name", ["quick", "normal", "thorough"])
def test_each_budget_keeps_enough_rounds_for_an_interval(name: str) -> None:
    settings = LATENCY_BUDGETS[name]
    assert settings.rounds >= 10 and settings.rounds % 2 == 0, "9+ rounds (a 95% median interval), even: balanced"
    with pytest.raises(ValueError, match="even"):
        LatencySettings(rounds=9)


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
        "2 trial(s) re-measured, 1 kept off the front (latency unstable)" + UNSTABLE_ADVICE)
    assert noise_line([{"accuracy": 0.9}], unstable=0) is None


# --------------------------------------------------------------------------- sequential stopping (the search)


def test_a_ten_times_slower_trial_stops_at_the_first_look() -> None:
    timer = fake_timer(lambda fn, i: 1.0 if fn is baseline else 10.0 * (1.0 + 0.01 * (i % 3)))
    stop = StopRule(references=(1.0, 2.5))
    paired = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None, stop=stop)
    assert paired.rounds == stop.first_look and paired.stopped == "decided" and paired.unstable is None
    assert paired.speedup == pytest.approx(0.1, rel=0.03) and paired.ci[1] < 1.0
    assert paired.metrics()["latency_stopped_early"] == 1.0


def test_a_tie_with_a_reference_runs_every_round() -> None:
    # 2.0x, against a front trial at 2.0x: neither faster; the measurement must not stop early
    timer = fake_timer(lambda fn, i: 1.0 if fn is baseline else 0.5 * (1.0 + 0.02 * (i % 2)))
    paired = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None,
                            stop=StopRule(references=(1.0, 2.0)))
    assert paired.rounds == ROUNDS and paired.stopped == "settled"
    assert paired.metrics()["latency_stopped_early"] == 0.0


def test_a_clear_winner_stops_early_without_a_front() -> None:
    timer = fake_timer(lambda fn, i: 1.0 if fn is baseline else 0.25)
    paired = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None, stop=StopRule())
    assert paired.rounds == 6 and paired.speedup == pytest.approx(4.0)


def test_no_trial_costs_more_than_a_fixed_multiple_of_the_baseline() -> None:
    # 100x slower and wildly noisy (never decided): the cost cap ends it within max_cost baseline measurements
    wild = itertools.cycle([50.0, 150.0, 80.0, 120.0])
    timer = fake_timer(lambda fn, i: 1.0 if fn is baseline else next(wild))
    stop = StopRule(references=(1.0,), first_look=1000, max_cost=3.0)
    paired = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None, stop=stop)
    assert paired.stopped == "cost cap" and paired.rounds < 3 * ROUNDS

    def cost(ms: float) -> float:
        return max(ms * SETTINGS.round_runs, 1000 * SETTINGS.round_seconds)

    spent = sum(cost(1.0) + cost(t) for t in paired.trial_samples)
    cap = stop.max_cost * 2 * ROUNDS * cost(1.0)
    last_round = cost(1.0) + cost(paired.trial_samples[-1])
    assert spent <= cap < spent + last_round, "it stops before a round like its last would pass the cap"


def test_a_model_whose_pair_of_rounds_costs_most_of_the_cap_stops_after_one_pair() -> None:
    """MiniLM under MLX's CPU backend (15.8 s a call against the baseline's 0.58 s: a pair of rounds costs 95 % of
    the cap) took 4 rounds, 63 s; one pair of rounds decides it."""
    timer = fake_timer(lambda fn, i: 20.0 if fn is baseline else 550.0)
    stop = StopRule(references=(1.0,), first_look=1000, max_cost=3.0)
    paired = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None, stop=stop)
    assert paired.stopped == "cost cap" and paired.rounds == 2 and paired.speedup == pytest.approx(20 / 550)


def test_a_model_whose_one_round_costs_over_half_the_cap_is_timed_in_one_round() -> None:
    """MiniLM under MLX's CPU backend, 19.1 s a call against the baseline's 0.6 s: its probe took 85 s with a pair of
    rounds; one round (one call, its warm-up call before it) decides it."""
    timer = fake_timer(lambda fn, i: 600.0 if fn is baseline else 19_100.0)
    stop = StopRule(references=(1.0,), first_look=1000, max_cost=3.0)
    paired = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None, stop=stop)
    assert paired.stopped == "cost cap" and paired.rounds == 1
    assert paired.speedup == pytest.approx(600 / 19_100) and paired.ci == pytest.approx((600 / 19_100,) * 2)


def test_the_decision_interval_is_wider_than_the_reported_one() -> None:
    """Repeated looks are paid for: the early decision reads a 99 % interval (the full range at 6 rounds)."""
    ratios = iter([3.0, 3.1, 2.9, 3.05, 2.95, 1.2] * 10)
    timer = fake_timer(lambda fn, i: 1.0 if fn is baseline else 1.0 / next(ratios))
    paired = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, SETTINGS, cpu_clock=None,
                            stop=StopRule(references=(1.0, 2.0)))
    assert paired.stopped != "decided" or paired.rounds > 6, "1.2x in the first six rounds straddles the 2.0x front"


# --------------------------------------------------------------------------- the self-pair rule


QUICK = LATENCY_BUDGETS["quick"]


def self_pair_clock(faster: Callable[[int], float]) -> FakeTimer:
    """The unoptimized model timed against a copy of itself: the copy's side reads ``faster(round)`` times quicker
    (a clock artifact: the same model cannot be faster than itself)."""
    return fake_timer(lambda fn, i: 1.0 if fn is baseline else 1.0 / faster(i))


def test_a_self_pair_that_looks_faster_at_first_is_timed_on_until_it_includes_one() -> None:
    """Its first rounds read 1.06x (what the quick budget's first look decided: faster than the baseline); the
    self-pair is never decided against 1.0, goes on, and reads 1.00x once its interval includes 1.0."""
    early = self_pair_clock(lambda i: 1.06 if i < 6 else 1.0)
    decided = measure_paired((baseline, INPUTS), (trial, INPUTS), early, QUICK, cpu_clock=None, stop=StopRule())
    assert decided.stopped == "decided" and decided.speedup == pytest.approx(1.06), "a trial: faster, decided"
    itself = measure_paired((baseline, INPUTS), (trial, INPUTS), self_pair_clock(lambda i: 1.06 if i < 6 else 1.0),
                            QUICK, cpu_clock=None, stop=StopRule(), self_pair=True)
    assert itself.stopped == "settled" and itself.unstable is None and itself.rounds == QUICK.rounds
    assert itself.speedup == 1.0 and itself.ci[0] <= 1.0 <= itself.ci[1]


def test_a_self_pair_whose_interval_excludes_one_is_not_settled_never_a_speedup() -> None:
    """The copy reads 1.20x in every round: as a trial that is a narrow, settled 1.20x; as the baseline against
    itself it is timed for every round the cap allows, then reported unstable (kept off the front), its reason said."""
    stop = StopRule(references=(1.0, 1.1))
    biased = measure_paired((baseline, INPUTS), (trial, INPUTS), self_pair_clock(lambda i: 1.2), QUICK,
                            cpu_clock=None, stop=stop)
    assert biased.unstable is None and biased.speedup == pytest.approx(1.2)
    itself = measure_paired((baseline, INPUTS), (trial, INPUTS), self_pair_clock(lambda i: 1.2), QUICK,
                            cpu_clock=None, stop=stop, self_pair=True)
    assert itself.unstable is not None and itself.rounds == QUICK.rounds * 3 and itself.attempts == 3
    assert itself.unstable.startswith("the unchanged model timed against itself: 1.20x, 95% CI [1.20, 1.20] "
                                      "excludes 1.00x over 30 rounds; timing not settled; load ")


@pytest.mark.parametrize("seed", range(20))
def test_a_noisy_self_pair_includes_one_or_is_unstable(seed: int) -> None:
    """Whatever the noise (a random clock, each side's time drawn anew per round), a self-pair reads 1.00x with an
    interval that includes 1.0, or is unstable: never a speed-up of its own."""
    rng = random.Random(seed)
    skew = rng.uniform(0.8, 1.25)  # a clock that favours one side, at most by this much
    timer = fake_timer(lambda fn, i: rng.lognormvariate(0.0, 0.3) * (skew if fn is trial else 1.0))
    itself = measure_paired((baseline, INPUTS), (trial, INPUTS), timer, QUICK, cpu_clock=None, stop=StopRule(),
                            self_pair=True)
    assert itself.unstable is not None or (itself.speedup == 1.0 and itself.ci[0] <= 1.0 <= itself.ci[1])
