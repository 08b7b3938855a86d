"""No dead end twice: what the measured trials say about each runtime on this model, and which proposals they rule out.

A runtime that ran the unchanged model far slower than another (``torch.compile`` at 0.70x where ONNX Runtime ran
4.18x on digits, one CPU thread) makes every recipe under it slow as well. The runtime sweep and the compositions
(:mod:`paretorch.pipeline.search.proposals`) ask :class:`RuntimeGains` before they propose a recipe under a runtime: the
estimate is the recipe's measured speed-up moved from the runtime it ran under to the other one by the two
runtimes' speed-ups on the unchanged model (its plain trials, complete or stopped by the latency probe:
:mod:`paretorch.pipeline.search.probe`). A proposal whose estimate is below :data:`DEAD_END_SHARE` of the fastest
feasible trial is not made; without a plain measurement of both runtimes there is no estimate, and the proposal stands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

import optuna
from optuna.trial import TrialState

from paretorch.pipeline.search.record import TrialRecord

#: A proposal estimated below this share of the fastest feasible speed-up is a dead end: not proposed.
DEAD_END_SHARE = 0.5


class Estimate(TypedDict, total=False):
    """What a proposal's estimate started from, as its trial stores it
    (:data:`~paretorch.pipeline.search.objectives.ATTR_ESTIMATE`): a runtime sweep's source speed-up and the runtime it
    ran under, or a composition's estimated gain over the unchanged model."""

    speedup: float
    under: str
    gain: float


@dataclass
class RuntimeGains:
    """Per runtime, the best speed-up of the unchanged model under it; and the fastest feasible speed-up."""

    plain: dict[str, float] = field(default_factory=dict)
    fastest: float = 0.0
    seen: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, study: optuna.Study, feasible: Callable[[TrialRecord], bool]) -> RuntimeGains:
        """Built from the study's trials with a paired speed-up (complete, or stopped by the probe); ``feasible``
        says which of them count for the fastest feasible speed-up."""
        gains = cls()
        for done in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            record = TrialRecord.from_trial(done)
            gains.add(record, feasible(record))
        return gains

    def add(self, record: TrialRecord, feasible: bool) -> None:
        """Index a trial with a paired speed-up (complete, or stopped by the probe), once."""
        speedup = record.metrics.get("speedup")
        if record.number in self.seen or speedup is None or speedup <= 0:
            return
        self.seen.add(record.number)
        stages = (record.recipe.model_stages() if record.recipe is not None
                  else [c for name, c in record.configs.items() if c is not None and not name.startswith("export")])
        if not stages:
            self.plain[record.runtime] = max(self.plain.get(record.runtime, 0.0), float(speedup))
        if feasible:
            self.fastest = max(self.fastest, float(speedup))

    def estimate(self, speedup: float, measured_under: str, runtime: str) -> float | None:
        """A recipe's speed-up under ``runtime``, from its ``speedup`` under ``measured_under`` (None: no estimate)."""
        if runtime == measured_under:
            return speedup
        here, there = self.plain.get(measured_under), self.plain.get(runtime)
        if not here or not there:
            return None
        return speedup * there / here

    def dead_end(self, estimate: float | None) -> bool:
        """Whether a proposal of this estimated speed-up cannot win: far below the fastest feasible trial."""
        return estimate is not None and self.fastest > 0 and estimate < DEAD_END_SHARE * self.fastest

    def plain_estimate(self, gain: float, runtime: str) -> float | None:
        """A composition's speed-up under ``runtime``: its estimated gain over the unchanged model under it."""
        base = self.plain.get(runtime)
        return gain * base if base else None

    def dead_end_reason(self, estimate: Estimate, runtime: str) -> str | None:
        """Why a proposal enqueued earlier is a dead end now (None: it may still win): what has been measured since
        (the runtime alone, a faster trial) puts its estimate below :data:`DEAD_END_SHARE` of the fastest."""
        value = (self.plain_estimate(float(estimate["gain"]), runtime) if "gain" in estimate
                 else self.estimate(float(estimate["speedup"]), str(estimate["under"]), runtime))
        if value is None or not self.dead_end(value):
            return None
        return (f"a dead end by what was measured since it was proposed: estimated {value:.2f}x under {runtime}, "
                f"below {DEAD_END_SHARE:.0%} of the fastest feasible trial's {self.fastest:.2f}x")
