"""How long latency is measured, and what a measurement says: the one settings object per ``--latency-budget``
and the statistics of timed calls.

Every path that times a model reads one :class:`LatencySettings` through the timing service
(:mod:`paretorch.pipeline.core.timing`): a model timed alone (:func:`~paretorch.pipeline.core.timing.measure_latency`,
inside :func:`paretorch.pipeline.core.evaluate.evaluate_model`: the runner, the screen, ``evaluate``, ``apply``; the
export stages' files), and the same model timed in rounds alternating with the baseline
(:mod:`paretorch.pipeline.core.paired`: the search's objective, the front's re-measure, the bench's paired rows).
:data:`LATENCY_BUDGETS` names the three settings a user chooses from (``--latency-budget``); the class's defaults
are the :data:`~paretorch.pipeline.core.names.DEFAULT_LATENCY_BUDGET`'s, so a path given no budget times as a user who
chose none.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from paretorch.pipeline.core.names import DEFAULT_LATENCY_BUDGET
from paretorch.pipeline.core.noise import median_ci
from paretorch.pipeline.core.spec import Batch


@dataclass(frozen=True)
class LatencySettings:
    """How long to measure.

    Timed alone: ``warmup_runs`` calls, then timed runs until both ``min_runs`` and ``min_seconds``
    are reached. Paired with the baseline: each side warmed up once (``warmup_runs`` calls), then
    ``rounds`` rounds that alternate which side goes first (an even count: each side first in half
    of them), each side timed ``round_runs`` calls and at least ``round_seconds`` per round. The defaults are the
    ``normal`` budget's (:data:`LATENCY_BUDGETS`)."""

    warmup_runs: int = 3
    min_runs: int = 20
    min_seconds: float = 0.3
    max_runs: int = 2000
    rounds: int = 10
    round_runs: int = 3
    round_seconds: float = 0.05
    #: A paired side's warm-up, and its calls in one round, stop at the first call that ends past this many seconds:
    #: a model many times slower than the baseline is timed on fewer of its calls (MiniLM under MLX's CPU backend,
    #: 0.03x: 20 s a b32 call, so 3 warm-up and 3 round calls made its probe take 176 s before this cap).
    call_cap_seconds: float = 2.0

    def __post_init__(self) -> None:
        if self.rounds < 2 or self.rounds % 2:
            raise ValueError(f"rounds must be even and at least 2 (each side first in half of them), not {self.rounds}")
        if self.round_runs < 1 or self.min_runs < 1:
            raise ValueError("round_runs and min_runs must be at least 1")


#: ``--latency-budget``: quick times 1 call per side per paired round
#: (a slow model's measurement costs about 2 x (warm-up + rounds) calls); thorough is the bench's.
LATENCY_BUDGETS: dict[str, LatencySettings] = {
    # Timed alone over 0.2 s at least, so one scheduling hiccup does not move the median.
    "quick": LatencySettings(warmup_runs=2, min_runs=10, min_seconds=0.2,
                             rounds=10, round_runs=1, round_seconds=0.02),
    "normal": LatencySettings(warmup_runs=3, min_runs=20, min_seconds=0.3,
                              rounds=10, round_runs=3, round_seconds=0.05),
    "thorough": LatencySettings(warmup_runs=10, min_runs=50, min_seconds=1.0,
                                rounds=20, round_runs=5, round_seconds=0.2),
}


def default_latency() -> LatencySettings:
    """The settings of the budget a user who chose none gets (``--latency-budget`` unset)."""
    return LATENCY_BUDGETS[DEFAULT_LATENCY_BUDGET]


@dataclass(frozen=True)
class LatencyStats:
    batch_size: int
    p50_ms: float
    p90_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    runs: int
    first_call_ms: float
    #: 95% confidence interval of the median over the timed runs (order statistics, pipeline/core/noise.py).
    p50_ci_low_ms: float = 0.0
    p50_ci_high_ms: float = 0.0

    @property
    def spread_pct(self) -> float:
        """(p90 - p50) / p50 in percent: how noisy the measurement was."""
        return 100.0 * (self.p90_ms - self.p50_ms) / self.p50_ms if self.p50_ms > 0 else 0.0


def batch_size_of(inputs: Batch) -> int:
    """The batch size of ``inputs`` (its first tensor's first dimension; 1 for a scalar)."""
    return int(inputs[0].shape[0]) if inputs and inputs[0].dim() > 0 else 1


def latency_stats(samples: list[float] | tuple[float, ...], batch_size: int, first_call_ms: float) -> LatencyStats:
    """The statistics of timed calls (ms): median with its 95 % interval, p90, mean, spread."""
    times = sorted(samples)
    ci = median_ci(times)
    return LatencyStats(
        batch_size=batch_size,
        p50_ms=statistics.median(times),
        p90_ms=times[min(len(times) - 1, round(0.9 * (len(times) - 1)))],
        mean_ms=statistics.fmean(times),
        std_ms=statistics.pstdev(times),
        min_ms=times[0],
        runs=len(times),
        first_call_ms=first_call_ms,
        p50_ci_low_ms=ci[0],
        p50_ci_high_ms=ci[1],
    )
