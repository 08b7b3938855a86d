"""Which trials the front holds: one trial beats another only with confidence; ties go to the simpler recipe.

A speed-up is a measurement with a 95% interval (:mod:`pipeline.core.paired`), so ranking trials by
their point values lets noise pick the winner: a stage that changes nothing measured 1.03x [1.02, 1.04]
once and displaced the baseline. Here trial A is **faster** than trial B only when both hold:

* A's speed-up interval clears B's (A's low end above B's high end; without intervals, the point values);
* A's speed-up is more than :data:`MIN_EFFECT` (3 %) above B's.

The metric (and the size, when it is an objective) compares by value: the evaluation is deterministic,
so the same model scores the same. A **beats** B when it is no worse on any objective and better on one;
A and B are **tied** when neither is better on any. The front is every feasible trial no feasible trial
beats; among front trials that tie, the simplest recipe (:attr:`Candidate.simplicity`: fewest stages,
counting a runtime other than eager as one, then eager before any other runtime, then the earlier trial)
leads and the others are listed as tied with it, with every feasible trial off the front that ties it too
(one that another trial beats, but this one does not). The baseline is the simplest recipe of all: a stage
that changes nothing ties it and never displaces it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from pipeline.search.objectives import ATTR_METRICS, ATTR_RECIPE, ATTR_RECIPE_LINE, ATTR_RUNTIME

#: One trial is faster than another only when its speed-up is more than this share above the other's.
MIN_EFFECT = 0.03
#: The rule in one line (the table's caption, the docs).
RULE = (f"a trial is faster only when its speed-up interval clears the other's and it is more than "
        f"{MIN_EFFECT:.0%} faster; ties go to the simplest recipe, the others listed after ~")


@dataclass(frozen=True)
class Candidate:
    """A complete trial, as the front rule reads it."""

    trial: FrozenTrial
    #: The task metric, signed so that higher is better.
    metric: float
    speedup: float
    #: The speed-up's 95% interval (NaN where not measured).
    ci: tuple[float, float]
    #: The serialized size when it is an objective, else None.
    size: float | None
    stages: int
    runtime: str
    recipe: str
    feasible: bool

    @property
    def simplicity(self) -> tuple[int, int, int]:
        """Sorts the simplest recipe first: fewest parts (model stages, plus one for a runtime other than
        eager), then eager first, then the earlier trial."""
        exotic = int(self.runtime != "eager")
        return self.stages + exotic, exotic, self.trial.number


def faster(a: Candidate, b: Candidate, min_effect: float = MIN_EFFECT) -> bool:
    """Whether ``a`` is faster than ``b`` with confidence (see the module docstring)."""
    if not a.speedup > b.speedup * (1.0 + min_effect):
        return False
    if all(math.isfinite(v) for v in (*a.ci, *b.ci)):
        return a.ci[0] > b.ci[1]
    return True


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def compare(a: Candidate, b: Candidate, min_effect: float = MIN_EFFECT) -> tuple[int, ...]:
    """Per objective: 1 where ``a`` is better than ``b``, -1 where worse, 0 where tied."""
    axes = [_sign(a.metric - b.metric),
            1 if faster(a, b, min_effect) else -1 if faster(b, a, min_effect) else 0]
    if a.size is not None and b.size is not None:
        axes.append(_sign(b.size - a.size))
    return tuple(axes)


def beats(a: Candidate, b: Candidate, min_effect: float = MIN_EFFECT) -> bool:
    """``a`` is no worse than ``b`` on any objective and better on one."""
    axes = compare(a, b, min_effect)
    return min(axes) >= 0 and max(axes) > 0


def tied(a: Candidate, b: Candidate, min_effect: float = MIN_EFFECT) -> bool:
    """Neither is better on any objective."""
    return not any(compare(a, b, min_effect))


@dataclass
class FrontGroup:
    """A front trial (the simplest of its ties) with its repeats (the same recipe) and its ties."""

    lead: Candidate
    repeats: list[int] = field(default_factory=list)
    tied: list[int] = field(default_factory=list)

    def add(self, other: Candidate) -> None:
        (self.repeats if other.recipe == self.lead.recipe else self.tied).append(other.trial.number)


def _kinds(study: optuna.Study) -> list[str]:
    """Each objective's kind (metric, latency, size) from the study's metric names (set when a search
    creates it), else in the order metric, latency, size."""
    names = study.metric_names or ["metric", "latency", "size_bytes"][:len(study.directions)]
    return ["latency" if n.startswith("latency") else "size" if n == "size_bytes" else "metric" for n in names]


def candidate(trial: FrozenTrial, kinds: Sequence[str], directions: Sequence[StudyDirection]) -> Candidate:
    """A complete trial with values, as the front rule reads it."""
    values = dict(zip(kinds, zip(trial.values, directions, strict=True), strict=True))
    metric, direction = values["metric"]
    metrics = trial.user_attrs.get(ATTR_METRICS, {})
    latency = values["latency"][0] if "latency" in values else math.nan
    speedup = float(metrics.get("speedup", 1.0 / latency if latency > 0 else math.nan))
    recipe = trial.user_attrs.get(ATTR_RECIPE) or {}
    stages = sum(1 for raw in recipe.get("stages", ()) if not str(raw.get("stage", "")).startswith("export."))
    return Candidate(
        trial=trial,
        metric=metric if direction == StudyDirection.MAXIMIZE else -metric,
        speedup=speedup,
        ci=(float(metrics.get("speedup_ci_low", math.nan)), float(metrics.get("speedup_ci_high", math.nan))),
        size=values["size"][0] if "size" in values else None,
        stages=stages,
        runtime=str(recipe.get("runtime", trial.user_attrs.get(ATTR_RUNTIME, "eager"))),
        recipe=str(trial.user_attrs.get(ATTR_RECIPE_LINE, trial.number)),
        feasible=all(v <= 0 for v in trial.constraints.values()),
    )


def candidates(study: optuna.Study) -> list[Candidate]:
    """Every complete trial with values, by number."""
    kinds = _kinds(study)
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return [candidate(t, kinds, study.directions) for t in sorted(done, key=lambda t: t.number)
            if t.values is not None]


def front_groups(pool: Sequence[Candidate], min_effect: float = MIN_EFFECT) -> list[FrontGroup]:
    """The front of the feasible candidates in ``pool``, one group per lead, simplest lead first."""
    feasible = [c for c in pool if c.feasible]
    front = [c for c in feasible if not any(beats(o, c, min_effect) for o in feasible if o is not c)]
    groups: list[FrontGroup] = []
    for member in sorted(front, key=lambda c: c.simplicity):
        group = next((g for g in groups if tied(g.lead, member, min_effect)), None)
        if group is None:
            groups.append(FrontGroup(member))
        else:
            group.add(member)
    for other in feasible:
        if other not in front:
            group = next((g for g in groups if tied(g.lead, other, min_effect)), None)
            if group is not None:
                group.add(other)
    return groups


def beaten_by(pool: Sequence[Candidate], groups: Sequence[FrontGroup],
              min_effect: float = MIN_EFFECT) -> dict[int, int]:
    """For each candidate neither leading nor listed in a group: the first front trial that beats it
    (a trial no front trial beats, an infeasible one better on some objective, is left out)."""
    listed = {n for g in groups for n in (g.lead.trial.number, *g.repeats, *g.tied)}
    leads = [g.lead for g in groups]
    result: dict[int, int] = {}
    for other in pool:
        if other.trial.number in listed:
            continue
        winner = next((lead for lead in leads if beats(lead, other, min_effect)), None)
        if winner is not None:
            result[other.trial.number] = winner.trial.number
    return result
