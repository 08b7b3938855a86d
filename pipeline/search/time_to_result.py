"""A search's time: the best feasible speed-up a study had found against the wall time it had run (time to
result), and where the wall time went (:class:`SearchTimes`).

:func:`best_so_far` reads a study's trials (``datetime_start`` / ``datetime_complete``, the feasibility verdict,
the paired speed-up): one point per feasible trial that raised the best point speed-up. Its MLflow parent run keeps
that curve as the metric ``time_to_result_speedup`` (step = seconds), and the bench writes it as ``time_to_result``
(``[seconds, best]`` pairs). The study's last console line (:func:`found_line`) names paretorch's best trial, the
front's lead (:func:`~.pareto.best_trials`: the table's first row), and when it was found; where the curve's
point values reach higher than that lead (a trial the front rule ties or beats: its interval, or its metric), the line
says so. Seconds count from the study's first trial's start: a resumed study's pause between runs counts too.

:class:`SearchTimes` splits the wall time by the runner's categories (model load, stages, evaluation, exports, runtime
sessions), the study start (:data:`STUDY_START`) and the rest (search, tracking and I/O), as the end of a search prints
it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.engine.runner import TIME_CATEGORIES
from paretorch.pipeline.search.objectives import ATTR_FEASIBLE, ATTR_LATENCY_UNSTABLE, ATTR_METRICS
from paretorch.pipeline.search.pareto import BestTrial


@dataclass(frozen=True)
class ResultPoint:
    """A feasible trial that raised the best speed-up: when it completed (seconds since the start), its speed-up."""

    seconds: float
    speedup: float
    trial: int


def study_start(trials: Sequence[FrozenTrial]) -> datetime | None:
    """When the study's first trial started (None: no trial started)."""
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    return min(starts) if starts else None


def best_so_far(trials: Sequence[FrozenTrial], started: datetime | None = None) -> list[ResultPoint]:
    """One point per complete, feasible, timing-trusted trial that raised the best paired speed-up, in completion
    order; seconds since ``started`` (default: the study's first trial's start)."""
    started = started or study_start(trials)
    done = sorted((t for t in trials if t.state == TrialState.COMPLETE and t.datetime_complete is not None
                   and t.user_attrs.get(ATTR_FEASIBLE) and not t.user_attrs.get(ATTR_LATENCY_UNSTABLE)
                   and "speedup" in t.user_attrs.get(ATTR_METRICS, {})),
                  key=lambda t: (t.datetime_complete, t.number))
    points: list[ResultPoint] = []
    for trial in done:
        speedup = float(trial.user_attrs[ATTR_METRICS]["speedup"])
        if points and speedup <= points[-1].speedup:
            continue
        assert trial.datetime_complete is not None and started is not None
        points.append(ResultPoint(max(0.0, (trial.datetime_complete - started).total_seconds()), speedup,
                                  trial.number))
    return points


def time_to_result(points: Sequence[ResultPoint]) -> list[list[float]]:
    """The curve as ``[seconds, best speed-up]`` pairs (both rising)."""
    return [[round(p.seconds, 1), round(p.speedup, 4)] for p in points]


def time_to_reach(points: Sequence[ResultPoint], speedup: float) -> float | None:
    """Seconds until the study first had a feasible trial at or above ``speedup`` (None: never)."""
    return next((p.seconds for p in points if p.speedup >= speedup), None)


def completed_after(trials: Sequence[FrozenTrial], number: int, started: datetime | None = None) -> float | None:
    """Seconds from ``started`` (default: the first trial's start) to trial ``number``'s completion (None: it has
    not completed)."""
    started = started or study_start(trials)
    done = next((t.datetime_complete for t in trials if t.number == number), None)
    return max(0.0, (done - started).total_seconds()) if done is not None and started is not None else None


def found_line(points: Sequence[ResultPoint], lead: BestTrial | None, found_after: float | None,
               total_seconds: float) -> str:
    """``time to result: the front's lead, trial 4 (4.11x), found after 45 s; ...``: paretorch's best trial (``lead``,
    the table's first row) and when it completed (``found_after``), the first feasible trial at 90 % of its
    speed-up where that came earlier, and the curve's peak where a trial off the front reaches higher."""
    if lead is None:
        return f"time to result: no trial on the front in {total_seconds:.0f} s"
    after = "" if found_after is None else f", found after {found_after:.0f} s"
    text = f"time to result: the front's lead, trial {lead.number} ({lead.speedup:.2f}x){after}"
    near = next((p for p in points if p.speedup >= 0.9 * lead.speedup), None)
    if near is not None and near.trial != lead.number and (found_after is None or near.seconds < found_after):
        text += f"; 90 % of its speed-up ({near.speedup:.2f}x, trial {near.trial}) after {near.seconds:.0f} s"
    peak = points[-1] if points else None
    if peak is not None and peak.trial != lead.number and peak.speedup > lead.speedup:
        text += (f"; the curve of best point speed-ups reaches {peak.speedup:.2f}x (trial {peak.trial}), a trial "
                 "off the front: tied with or beaten by a front trial (its MLflow tags say which)")
    return text + f"; the study's trials ran {total_seconds:.0f} s"


def trials_seconds(trials: Sequence[FrozenTrial], started: datetime | None = None) -> float:
    """Seconds from ``started`` (default: the first trial's start) to the last trial's completion."""
    started = started or study_start(trials)
    ends = [t.datetime_complete for t in trials if t.datetime_complete is not None]
    return max(0.0, (max(ends) - started).total_seconds()) if ends and started else 0.0


#: The category of a study start's own seconds (the unoptimized model's reference pass and self-check, the noise
#: floor's bf16 pass, the machine probe, the seeds; the baseline's own run is the runner's categories).
STUDY_START = "study_start"


@dataclass
class SearchTimes:
    """Where the wall time went (seconds)."""

    wall: float = 0.0
    by_category: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_CATEGORIES, 0.0))

    @property
    def work(self) -> float:
        return sum(self.by_category.values())

    @property
    def other(self) -> float:
        return max(0.0, self.wall - self.work)

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in self.by_category.items())
        share = 100.0 * self.other / self.wall if self.wall else 0.0
        return f"{self.wall:.1f} s in all: {parts}; search, tracking and I/O {self.other:.1f} s ({share:.1f}%)"
