"""Which trials the front holds: one trial beats another only with confidence, on every objective alike.

Every objective is a measurement with an interval: the speed-up its paired 95% interval
(:mod:`paretorch.pipeline.core.paired`), the task metric its paired bootstrap interval
(:mod:`paretorch.pipeline.core.bootstrap`; the stored interval of the drop, ``metric_drop_ci_low``/``_high``, turned
into one of the metric: the drop is the baseline's value less the metric, signed so that positive is worse, so the
metric's low end is its value less the drop's upper spread). The size, when it is an objective, is exact (a zero-width
interval; compared where both trials have one: a study's trials all do, or none), and so is any value stored without an
interval. Per objective, with each interval widened to hold its point:

* A is **no worse** than B when A's low end, point and high end are each at least B's;
* A is **better** than B when A's low end is above B's high end and, on the speed-up, A's point is more than
  :data:`MIN_EFFECT` (3 %) above B's (:func:`faster`: a stage that changes nothing measured 1.03x [1.02, 1.04]
  once and would have displaced the baseline).

A **beats** B when it is no worse on every objective and better on one. That is a strict partial order: never
A beats A (a low end above its own high end), and if A beats B and B beats C, A is no worse than C on every
objective (each "no worse" compares three numbers by >=) and better on the objective where A is better than B
(A's low end > B's high end >= C's high end; A's point > B's * 1.03 >= C's * 1.03). So the front, every feasible
trial no feasible trial beats, is monotone: in a finite strict partial order every trial off the front is beaten
by a front trial, and a trial leaves the front only when a front trial beats it. This "no worse" is the loosest
that chains with a "better" read off cleared intervals whatever the trials: for every C that B is better than to
be one A is better than, A's low end must be at least B's, and for every C better than A to be better than B, A's
high end must be at least B's (the point carries the 3 %). The rule this replaced compared
the metric by value and the speed-up by interval, with "no worse" meaning "not worse with confidence", which does
not chain: a trial faster than a front trial dropped off the front once a third trial, tied with that front
trial, beat it on the metric. Comparing all three numbers costs something: a trial whose metric interval is not
at least as high at both ends (an equal accuracy but a wider interval, such as any trial against the baseline's
zero-width one) is not no worse on the metric, so a faster speed-up does not beat it, and both stay on the front.

A and B are **tied** when neither is better on any objective. Front trials are grouped by simplicity
(:attr:`Candidate.simplicity`: fewest stages, counting a runtime other than eager as one, then eager before any
other runtime, then the earlier trial): the simplest leads, and a front trial tied with a lead **within reach** of
it (on every objective the lead's high end at or above the trial's point, and the trial's low end at or below the
lead's point: each could be the other) is listed after it; any other front trial leads a group of its own, so the
fastest feasible trial is always shown, leading or tied with a lead whose interval reaches its speed-up. A feasible
trial off the front tied with a lead that reaches it is listed with it too. The baseline is the simplest recipe of
all: a stage that changes nothing (within 3 %) is never faster, so it ties the baseline and never displaces it (it
is listed with the baseline where the baseline's interval reaches it, else it leads its own row beside it).

**Why each trial is where it is** (on the front, tied with a front trial, or beaten by which front trial) is written
when a study ends (the front is known only then) as MLflow tags on each trial's run and as one study user attribute
(Optuna does not let finished trials change): :func:`dominated_by`, :func:`front_tags`. "Beaten" is this rule, not
point values; :func:`dominates` is Optuna's point-value dominance, what optuna-dashboard shows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.search.objectives import (
    ATTR_METRICS,
    ATTR_RECIPE,
    ATTR_RECIPE_LINE,
    ATTR_RUNTIME,
    stored_interval,
)

#: One trial is faster than another only when its speed-up is more than this share above the other's.
MIN_EFFECT = 0.03
#: No interval: a value compared as exact.
NO_INTERVAL = (math.nan, math.nan)
#: The rule in one line (the table's caption, the docs).
RULE = (f"a trial beats another only when no worse on every objective (both ends of its 95% interval and its "
        f"value) and better on one (its interval clear above; a speed-up also by more than {MIN_EFFECT:.0%}); ties "
        f"go to the simplest recipe within reach (each interval reaching the other's value), the others listed after ~")


@dataclass(frozen=True)
class Measure:
    """One objective of one trial, signed so that higher is better: its value and its interval, which holds it."""

    point: float
    low: float
    high: float

    @classmethod
    def of(cls, point: float, interval: tuple[float, float] = NO_INTERVAL) -> Measure:
        """``point`` with ``interval`` (missing ends: the point), widened to hold the point."""
        low, high = (point if math.isnan(end) else end for end in interval)
        return cls(point, min(low, point), max(high, point))

    def no_worse(self, other: Measure) -> bool:
        return self.low >= other.low and self.point >= other.point and self.high >= other.high

    def better(self, other: Measure, min_effect: float = 0.0) -> bool:
        """Above ``other`` with confidence: the intervals clear, and the point by more than ``min_effect``."""
        return self.low > other.high and self.point > other.point * (1.0 + min_effect)

    def reaches(self, other: Measure) -> bool:
        """This interval's high end is at ``other``'s value or above: this could be as high."""
        return self.high >= other.point


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
    #: The (signed) metric's 95% bootstrap interval (NaN where none was computed).
    metric_ci: tuple[float, float] = NO_INTERVAL

    @property
    def simplicity(self) -> tuple[int, int, int]:
        """Sorts the simplest recipe first: fewest parts (model stages, plus one for a runtime other than
        eager), then eager first, then the earlier trial."""
        exotic = int(self.runtime != DEFAULT_RUNTIME)
        return self.stages + exotic, exotic, self.trial.number

    @property
    def speed(self) -> Measure:
        return Measure.of(self.speedup, self.ci)

    def measures(self, other: Candidate, min_effect: float = MIN_EFFECT) -> list[tuple[Measure, Measure, float]]:
        """Per objective both trials have: this trial's measure, ``other``'s, and the share by which a point must
        be above the other's to be better (``min_effect`` on the speed-up, none elsewhere)."""
        pairs = [(Measure.of(self.metric, self.metric_ci), Measure.of(other.metric, other.metric_ci), 0.0),
                 (self.speed, other.speed, min_effect)]
        if self.size is not None and other.size is not None:
            pairs.append((Measure.of(-self.size), Measure.of(-other.size), 0.0))
        return pairs


def faster(a: Candidate, b: Candidate, min_effect: float = MIN_EFFECT) -> bool:
    """Whether ``a`` is faster than ``b`` with confidence: its speed-up interval clears ``b``'s and its speed-up is
    more than ``min_effect`` above ``b``'s (without intervals: the speed-ups alone)."""
    return a.speed.better(b.speed, min_effect)


def _better_on_one(a: Candidate, b: Candidate, min_effect: float) -> bool:
    return any(x.better(y, effect) for x, y, effect in a.measures(b, min_effect))


def beats(a: Candidate, b: Candidate, min_effect: float = MIN_EFFECT) -> bool:
    """``a`` is no worse than ``b`` on every objective and better with confidence on one (a strict partial order)."""
    axes = a.measures(b, min_effect)
    return all(x.no_worse(y) for x, y, _ in axes) and any(x.better(y, effect) for x, y, effect in axes)


def tied(a: Candidate, b: Candidate, min_effect: float = MIN_EFFECT) -> bool:
    """Neither is better with confidence on any objective."""
    return not _better_on_one(a, b, min_effect) and not _better_on_one(b, a, min_effect)


def reaches(lead: Candidate, other: Candidate) -> bool:
    """On every objective, ``lead``'s interval reaches ``other``'s value and ``other``'s reaches back down to
    ``lead``'s: each could be the other. A lead with a wide interval from a short measurement does not hide a
    trial measured clear above the lead's own value (an H200 study folded ``pack + fp16 | cudagraphs`` at 2.85x
    [2.53, 3.01] under ``bf16 | compile`` at 2.33x [1.81, 3.33], timed 6 rounds, and named the slower one best)."""
    return all(x.reaches(y) and y.low <= x.point for x, y, _ in lead.measures(other))


def joins(lead: Candidate, other: Candidate, min_effect: float = MIN_EFFECT) -> bool:
    """Whether ``other`` is listed with ``lead``: tied with it, and within reach of it (:func:`reaches`)."""
    return tied(lead, other, min_effect) and reaches(lead, other)


@dataclass
class FrontGroup:
    """A front trial (the simplest of its ties) with its repeats (the same recipe) and its ties."""

    lead: Candidate
    repeats: list[int] = field(default_factory=list)
    tied: list[int] = field(default_factory=list)
    #: The front trials (no feasible trial beats them) among the repeats and the ties.
    folded: list[Candidate] = field(default_factory=list)

    def add(self, other: Candidate, on_front: bool = False) -> None:
        (self.repeats if other.recipe == self.lead.recipe else self.tied).append(other.trial.number)
        if on_front:
            self.folded.append(other)


def _kinds(study: optuna.Study) -> list[str]:
    """Each objective's kind (metric, latency, size) from the study's metric names (set when a search
    creates it), else in the order metric, latency, size."""
    names = study.metric_names or ["metric", "latency", "size_bytes"][:len(study.directions)]
    return ["latency" if n.startswith("latency") else "size" if n == "size_bytes" else "metric" for n in names]


def metric_interval(metric: float, drop: float, drop_ci: tuple[float, float]) -> tuple[float, float]:
    """The signed metric's interval from its drop's (the drop is a constant less the signed metric, whichever
    way the metric points; NaN where the drop or its interval is missing)."""
    low, high = drop_ci
    if not all(math.isfinite(v) for v in (drop, low, high)):
        return NO_INTERVAL
    return metric - (high - drop), metric + (drop - low)


def candidate(trial: FrozenTrial, kinds: Sequence[str], directions: Sequence[StudyDirection]) -> Candidate:
    """A complete trial with values, as the front rule reads it."""
    values = dict(zip(kinds, zip(trial.values, directions, strict=True), strict=True))
    metric, direction = values["metric"]
    signed = metric if direction == StudyDirection.MAXIMIZE else -metric
    metrics = trial.user_attrs.get(ATTR_METRICS, {})
    latency = values["latency"][0] if "latency" in values else math.nan
    speedup = float(metrics.get("speedup", 1.0 / latency if latency > 0 else math.nan))
    recipe = trial.user_attrs.get(ATTR_RECIPE) or {}
    stages = sum(1 for raw in recipe.get("stages", ()) if not str(raw.get("stage", "")).startswith("export."))
    return Candidate(
        trial=trial,
        metric=signed,
        speedup=speedup,
        ci=(float(metrics.get("speedup_ci_low", math.nan)), float(metrics.get("speedup_ci_high", math.nan))),
        size=values["size"][0] if "size" in values else None,
        stages=stages,
        runtime=str(recipe.get("runtime", trial.user_attrs.get(ATTR_RUNTIME, DEFAULT_RUNTIME))),
        recipe=str(trial.user_attrs.get(ATTR_RECIPE_LINE, trial.number)),
        feasible=all(v <= 0 for v in trial.constraints.values()),
        metric_ci=metric_interval(signed, float(metrics.get("metric_drop", math.nan)), stored_interval(metrics)),
    )


def candidates(study: optuna.Study) -> list[Candidate]:
    """Every complete trial with values, by number."""
    kinds = _kinds(study)
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return [candidate(t, kinds, study.directions) for t in sorted(done, key=lambda t: t.number)
            if t.values is not None]


def front_of(pool: Sequence[Candidate], min_effect: float = MIN_EFFECT) -> list[Candidate]:
    """The feasible candidates no feasible candidate beats, in ``pool``'s order."""
    feasible = [c for c in pool if c.feasible]
    return [c for c in feasible if not any(beats(o, c, min_effect) for o in feasible if o is not c)]


def _group_of(groups: Sequence[FrontGroup], other: Candidate, min_effect: float) -> FrontGroup | None:
    """The first group whose lead ``other`` joins (:func:`joins`)."""
    return next((g for g in groups if joins(g.lead, other, min_effect)), None)


def front_groups(pool: Sequence[Candidate], min_effect: float = MIN_EFFECT) -> list[FrontGroup]:
    """The front of the feasible candidates in ``pool``, one group per lead, simplest lead first."""
    front = front_of(pool, min_effect)
    groups: list[FrontGroup] = []
    for member in sorted(front, key=lambda c: c.simplicity):
        group = _group_of(groups, member, min_effect)
        if group is None:
            groups.append(FrontGroup(member))
        else:
            group.add(member, on_front=True)
    for other in pool:
        if other.feasible and other not in front and (group := _group_of(groups, other, min_effect)) is not None:
            group.add(other)
    return groups


def first_beater(winners: Sequence[Candidate], other: Candidate, min_effect: float = MIN_EFFECT) -> Candidate | None:
    """The first of ``winners`` that beats ``other`` (None: none does)."""
    return next((w for w in winners if beats(w, other, min_effect)), None)


def beaten_by(pool: Sequence[Candidate], groups: Sequence[FrontGroup],
              min_effect: float = MIN_EFFECT) -> dict[int, int]:
    """For each candidate neither leading nor listed in a group: the first front trial that beats it, a lead before
    a front trial listed with one (a trial no front trial beats, an infeasible one better on some objective, is
    left out)."""
    listed = {n for g in groups for n in (g.lead.trial.number, *g.repeats, *g.tied)}
    winners = [g.lead for g in groups] + [c for g in groups for c in g.folded]
    result: dict[int, int] = {}
    for other in pool:
        if other.trial.number not in listed and (winner := first_beater(winners, other, min_effect)) is not None:
            result[other.trial.number] = winner.trial.number
    return result


# ------------------------------------------------------------------ why each trial is where it is


def dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[StudyDirection]) -> bool:
    """True when ``a`` is at least as good as ``b`` in every objective and better in one."""
    better = False
    for x, y, direction in zip(a, b, directions, strict=True):
        if direction == StudyDirection.MAXIMIZE:
            x, y = -x, -y
        if x > y:
            return False
        better = better or x < y
    return better


def dominated_by(study: optuna.Study, front: Sequence[FrozenTrial]) -> dict[int, int]:
    """For each complete trial off ``front``: the front trial that beats it (the front's rule:
    :func:`paretorch.pipeline.search.front_rule.beats`), the first by number of ``front``, else the first by number of
    the front trials listed with them (a front trial tied with a simpler one). A trial no front trial beats (one tied
    with a front trial, an infeasible one that is better in some objective) is left out."""
    numbers = {t.number for t in front}
    pool = candidates(study)
    groups = [g for g in front_groups(pool) if g.lead.trial.number in numbers]
    listed = sorted((c for g in groups for c in g.folded), key=lambda c: c.trial.number)
    winners = [c for c in pool if c.trial.number in numbers] + listed
    result: dict[int, int] = {}
    for other in pool:
        if other.trial.number not in numbers and (winner := first_beater(winners, other)) is not None:
            result[other.trial.number] = winner.trial.number
    return result


def front_tags(study: optuna.Study, distinct: Sequence[tuple[FrozenTrial, list[int]]],
               dominated: dict[int, int]) -> dict[int, dict[str, str]]:
    """MLflow tags per trial: ``pareto`` (once per distinct recipe), ``same_as`` for a front trial
    that repeats an earlier one's recipe and numbers, ``tied_with`` for a trial tied with a front trial
    (:mod:`paretorch.pipeline.search.front_rule`: the simpler recipe leads), ``dominated_by`` for the others."""
    tags: dict[int, dict[str, str]] = {}
    for number, winner in dominated.items():
        tags[number] = {"pareto": "false", "dominated_by": str(winner)}
    for trial, repeats in distinct:
        tags[trial.number] = {"pareto": "true"}
        for number in repeats:
            tags[number] = {"pareto": "false", "same_as": str(trial.number)}
    leads = {t.number for t, _ in distinct}
    for group in front_groups(candidates(study)):
        if group.lead.trial.number in leads:
            for number in group.tied:
                tags[number] = {"pareto": "false", "tied_with": str(group.lead.trial.number)}
    return tags
