"""Hypervolume against trials, over hand-made trial lists whose 2-D volume is computed by hand."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
from optuna._hypervolume import compute_hypervolume

from paretorch.experiments.bench.hypervolume import (
    TrialPoint,
    counted_prefix,
    history,
    hypervolume,
    normalised,
    pareto_front,
)

E = math.e


def point(number: int, drop_share: float, speedup: float, feasible: bool = True, counted: bool = True) -> TrialPoint:
    return TrialPoint(number, counted, feasible, drop_share, speedup, recipe=f"r{number}")


def test_the_scale_keeps_the_share_of_the_allowed_drop_and_the_log_speed_up() -> None:
    assert normalised(point(0, 0.25, E**2)) == (0.75, 2.0)
    assert normalised(point(0, -0.5, E)) == (1.0, 1.0)  # above the baseline counts as no drop
    assert normalised(point(0, 1.0, 0.5)) == (0.0, 0.0)  # at the allowed drop, slower than the baseline


def test_two_rectangles_by_hand() -> None:
    # [0, 1] x [0, 1] and [0, 0.5] x [0, 3]: 1 + 0.5 * (3 - 1) = 2
    assert hypervolume([point(0, 0.0, E), point(1, 0.5, E**3)]) == 2.0
    # a point inside the staircase adds nothing; the order of the points does not matter
    assert hypervolume([point(0, 0.5, E**3), point(1, 0.25, E**0.5), point(2, 0.0, E)]) == 2.0


def test_infeasible_and_unusable_trials_never_count() -> None:
    assert hypervolume([point(0, 0.0, E**5, feasible=False), point(1, 0.0, math.nan), point(2, math.nan, E)]) == 0.0
    assert hypervolume([point(0, 0.0, E), point(1, 0.0, E**5, feasible=False)]) == 1.0


def test_history_steps_at_counted_trials_only_and_ignores_infeasible_ones() -> None:
    trials = [point(0, 0.0, 1.0), point(1, 0.0, E), point(2, 0.0, E**4, feasible=False),
              point(3, 0.0, E, counted=False), point(4, 0.25, E**0.5), point(5, 0.5, E**3)]
    assert history(trials) == [0.0, 1.0, 1.0, 1.0, 2.0]
    assert history(list(reversed(trials))) == history(trials)  # trial numbers order them, not the list


def test_counted_prefix_takes_the_repeats_inside_it() -> None:
    trials = [point(0, 0.0, 1.0), point(1, 0.0, E, counted=False), point(2, 0.0, E), point(3, 0.0, E**2)]
    assert [p.number for p in counted_prefix(trials, 2)] == [0, 1, 2]
    assert hypervolume(counted_prefix(trials, 2)) == history(trials)[1]


def test_the_front_is_the_non_dominated_feasible_points_fastest_first_once_each() -> None:
    trials = [point(0, 0.0, E), point(1, 0.5, E**3), point(2, 0.25, E**0.5), point(3, 0.0, E),
              point(4, 0.0, E**9, feasible=False), point(5, -0.2, E)]
    assert [p.number for p in pareto_front(trials)] == [1, 0]  # 3 and 5 sit where 0 does (5: clipped)


def test_history_never_decreases_and_agrees_with_optuna() -> None:
    rng = random.Random(7)
    trials = [point(i, rng.uniform(-0.5, 1.0), math.exp(rng.uniform(-0.5, 2.0)), feasible=rng.random() < 0.7,
                    counted=rng.random() < 0.9) for i in range(60)]
    volumes = history(trials)
    assert len(volumes) == sum(p.counted for p in trials)
    assert all(later >= earlier for earlier, later in itertools.pairwise(volumes))
    assert volumes[-1] > 0
    # Optuna minimizes towards a reference point: (drop share used, -gain) against (1, 0).
    feasible = [normalised(p) for p in trials if p.feasible]
    losses = np.array([[1.0 - keep, -gain] for keep, gain in feasible if gain > 0 and keep > 0])
    assert math.isclose(volumes[-1], compute_hypervolume(losses, np.array([1.0, 0.0])), rel_tol=1e-9)
