"""Paired bootstrap of the task metric: the metric drop's 95 % interval, from outputs already computed.

Every metric that supports it (:attr:`paretorch.pipeline.core.spec.Metric.resampled`) is recomputed on
:data:`RESAMPLES` resamples of its evaluation units (examples for accuracy, pairs for Spearman,
queries for nDCG), drawn from one fixed seed: a given number of units gets the same resamples in
every process, so the baseline's and every trial's values are paired resample by resample, and a
trial's drop on resample ``i`` is ``metric(baseline, i) - metric(trial, i)``. No model runs again: the
resamples index the outputs the evaluation already holds, on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch
from torch import Tensor

#: How many resamples a metric is recomputed on: a count fixed by the number of units (the baseline's and a
#: trial's pair up), :data:`RESAMPLES` unless that would hold more than :data:`INDEX_BUDGET` indices
#: (:func:`resample_count`). At 2,000 the interval's ends move by well under 0.1 point of a 0-100 metric between
#: seeds (tests/pipeline/core/test_bootstrap.py checks it); 200, the count before, moved them by up to 0.3.
RESAMPLES = 2000
#: Fewest resamples of a large evaluation set.
MIN_RESAMPLES = 200
#: Most resample indices held at once (8 bytes each: 160 MB).
INDEX_BUDGET = 20_000_000
#: The seed of the resample indices (fixed: every trial of every study draws the same resamples).
SEED = 20260
#: The interval's coverage.
LEVEL = 0.95


@cache
def _indices(units: int, count: int, seed: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(units, (count, units), generator=generator)


def resample_count(units: int) -> int:
    """How many resamples ``units`` units get: :data:`RESAMPLES`, fewer (down to :data:`MIN_RESAMPLES`) where the
    indices would exceed :data:`INDEX_BUDGET`."""
    return max(MIN_RESAMPLES, min(RESAMPLES, INDEX_BUDGET // max(units, 1)))


def resample_indices(units: int, device: torch.device | str = "cpu", count: int | None = None,
                     seed: int = SEED) -> Tensor:
    """``(count, units)`` indices: row ``i`` is resample ``i`` of ``units`` units, drawn with replacement."""
    if units < 1:
        raise ValueError(f"a bootstrap needs at least one unit, got {units}")
    return _indices(units, resample_count(units) if count is None else count, seed).to(device)


def resampled_means(values: Tensor) -> Tensor:
    """The mean of a per-unit value (a correct prediction, a query's nDCG) on every resample: ``(count,)``."""
    return values.float()[resample_indices(int(values.shape[0]), values.device)].mean(dim=1)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) with linear interpolation between order statistics (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def drop_interval(baseline: Sequence[float], trial: Sequence[float], higher_is_better: bool,
                  level: float = LEVEL) -> tuple[float, float] | None:
    """The ``level`` percentile interval of the paired drop (positive = worse), None when the two were not
    resampled alike (a metric without resamples, or a baseline stored before them)."""
    if not baseline or len(baseline) != len(trial):
        return None
    sign = 1.0 if higher_is_better else -1.0
    drops = [sign * (b - t) for b, t in zip(baseline, trial, strict=True)]
    tail = (1.0 - level) / 2.0
    return percentile(drops, tail), percentile(drops, 1.0 - tail)
