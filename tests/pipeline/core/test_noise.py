"""The median's confidence interval: order statistics with at least the requested coverage."""

from __future__ import annotations

import random

import pytest

from paretorch.pipeline.core.noise import median_ci, overlaps


def test_interval_ranks_follow_the_binomial() -> None:
    assert median_ci(list(range(10))) == (1, 8)
    assert median_ci(list(range(100))) == (39, 60)
    assert median_ci([5.0, 1.0, 3.0]) == (1.0, 5.0), "too few samples: the full range"
    with pytest.raises(ValueError, match="at least one sample"):
        median_ci([])


def test_coverage_is_at_least_95_percent_on_skewed_timings() -> None:
    rng = random.Random(0)
    true_median = 0.6931471805599453  # of the exponential(1) distribution
    hits = sum(lo <= true_median <= hi for lo, hi in
               (median_ci([rng.expovariate(1.0) for _ in range(30)]) for _ in range(2000)))
    assert hits / 2000 >= 0.95


def test_overlap_is_a_tie() -> None:
    assert overlaps((1.0, 2.0), (1.5, 3.0)) and overlaps((1.0, 2.0), (2.0, 3.0))
    assert not overlaps((1.0, 2.0), (2.1, 3.0))
