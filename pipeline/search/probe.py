"""The latency probe: a trial is timed beside the baseline *before* its evaluation, and one far behind the front
stops there, its metric never scored.

A trial's paired measurement (:mod:`paretorch.pipeline.core.paired`) runs right after its stages, with a
:class:`~paretorch.pipeline.core.paired.StopRule` whose references are the baseline (1.0) and the speed-ups of the
current front (:func:`front_references`): it stops as soon as its interval clears each of them. When it is then slower,
with confidence, than the front trial with the best metric *and* than its runtime running the unchanged model
(:func:`behind_front`), no metric can put it on the front (it would need a metric above the best one measured)
and its stages are no building block either: under its runtime they cost speed, so no composition
(:mod:`paretorch.pipeline.search.compose`) wants them. A technique that buys speed under its runtime (pruning under
eager at 1.35x, far behind int8 under ONNX Runtime at 3.8x) is scored: its drop is what a composition needs. Such a
trial ends as pruned with its measured speed-up and the reason (a 0.07x recipe
is decided in its first rounds, not after a full evaluation and a full timing). Every other trial goes on to its
evaluation, and its paired measurement is its latency: it is not timed again (one number per fact).
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from paretorch.pipeline.core.paired import PairedLatency, StopRule
from paretorch.pipeline.search.front_rule import MIN_EFFECT, candidates, front_groups

#: The ends of a paired measurement whose interval the probe may judge: decided by the stop rule, stopped at its cost
#: cap, or settled (its full rounds, a narrow 95 % interval: the int8 stage list swept under eager at 0.90x
#: [0.86, 0.93] was scored in full because it settled instead of deciding); not a round limit's wide interval.
DECIDING = ("decided", "cost cap", "settled")
#: How a trial stopped by the probe starts its reason (a pruned trial: it was measured, and is behind the front).
BEHIND_FRONT = "stopped by the latency probe"


@dataclass(frozen=True)
class FrontReferences:
    """What a trial's probe decides against: the front's speed-ups and its best-scoring trial."""

    #: Speed-ups the measurement must tell the trial from: 1.0 (the baseline) and each front trial's.
    speedups: tuple[float, ...] = (1.0,)
    #: The front trial with the best metric (the fastest among equals): (trial number, speed-up); None before any.
    top: tuple[int, float] | None = None

    def stop_rule(self, unchanged: bool = False) -> StopRule:
        """What the probe's measurement stops at. A runtime alone on the ``unchanged`` model decides against the
        best-scoring front trial only (its metric cannot beat that trial's, :func:`behind_front`): a fp32 runtime
        tied with the baseline at 1.0x is not timed in full when the front is at 3x."""
        if unchanged and self.top is not None:
            return StopRule(references=(self.top[1],), min_effect=MIN_EFFECT)
        return StopRule(references=self.speedups, min_effect=MIN_EFFECT)


def front_references(study: optuna.Study) -> FrontReferences:
    """The current front's speed-ups (and 1.0) and its best-scoring trial, read from the study."""
    leads = [group.lead for group in front_groups(candidates(study))]
    speedups = sorted({1.0, *(lead.speedup for lead in leads if lead.speedup > 0)})
    if not leads:
        return FrontReferences(tuple(speedups))
    best = max(leads, key=lambda c: (c.metric, c.speedup))
    return FrontReferences(tuple(speedups), (best.trial.number, best.speedup))


def behind_front(paired: PairedLatency, front: FrontReferences, runtime: str, plain: float | None = None,
                 min_effect: float = MIN_EFFECT, unchanged: bool = False) -> str | None:
    """Why the probe ends the trial (None: it goes on): its measurement decided it slower, by more than the minimum
    effect, than the best-scoring front trial and than the unchanged model under its ``runtime`` (``plain``: that
    trial's speed-up where measured; never less than the unoptimized model's 1.0). A trial of the ``unchanged``
    model (a runtime alone) has no stages to build on: slower than the best-scoring front trial is enough (its
    metric is the unoptimized model's, which that trial's already matches; its speed-up is recorded for the
    runtime estimates of :mod:`paretorch.pipeline.search.dead_ends` all the same)."""
    if front.top is None or paired.unstable is not None or paired.stopped not in DECIDING:
        return None
    number, speedup = front.top
    own = 0.0 if unchanged else max(1.0, plain or 0.0)
    high = paired.ci[1] * (1.0 + min_effect)
    if high >= speedup or high >= own > 0.0:
        return None
    against = ", and is a runtime alone on the unchanged model" if unchanged else (
        f" and than the unchanged model under {runtime} ({own:.2f}x)")
    return (f"{BEHIND_FRONT}: {paired.speedup:.2f}x [{paired.ci[0]:.2f}, {paired.ci[1]:.2f}] paired after "
            f"{paired.rounds} rounds ({paired.stopped}), slower than trial {number} ({speedup:.2f}x, the front's best "
            f"metric){against}: not scored")
