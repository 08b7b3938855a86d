"""The front's properties over random trial sets with intervals on the metric and the speed-up (seeded, no
hypothesis): beats is a strict partial order, every feasible trial off the front is beaten by a front trial,
adding a trial removes a front trial only when a front trial beats it, the fastest feasible trial is always shown,
and the issue's digits case keeps its fastest trial."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import optuna
from optuna.trial import TrialState

from paretorch.pipeline.search.front_rule import (
    Candidate,
    FrontGroup,
    beaten_by,
    beats,
    front_groups,
    front_of,
    metric_interval,
    tied,
)

#: How many random trial sets each property runs on.
SETS = 3000
SEED = 42
#: Accuracies a trial draws from (a few, so that equal values occur, as on a small evaluation set).
ACCURACIES = (0.9890, 0.9910, 0.9924, 0.9936, 0.9950, 0.9962)


def frozen(number: int) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(values=[0.0, 1.0], state=TrialState.COMPLETE)
    trial.number = number
    return trial


def make(number: int, metric: float, speedup: float, ci: tuple[float, float] = (math.nan, math.nan),
         metric_ci: tuple[float, float] = (math.nan, math.nan), stages: int = 0, runtime: str = "eager",
         feasible: bool = True, size: float | None = None, recipe: str = "") -> Candidate:
    return Candidate(trial=frozen(number), metric=metric, speedup=speedup, ci=ci, size=size, stages=stages,
                     runtime=runtime, recipe=recipe or f"recipe {number}", feasible=feasible, metric_ci=metric_ci)


def random_candidate(rng: random.Random, number: int, sized: bool) -> Candidate:
    """A trial: an accuracy with a drop interval (or none), a speed-up with a paired interval (or none)."""
    metric = rng.choice(ACCURACIES)
    metric_ci = (math.nan, math.nan)
    if rng.random() < 0.8:
        drop = 0.9950 - metric
        metric_ci = metric_interval(metric, drop, (drop - rng.uniform(0.0, 0.004), drop + rng.uniform(0.0, 0.004)))
    speedup = round(math.exp(rng.uniform(-0.2, 1.8)), 2)
    ci = (math.nan, math.nan)
    if rng.random() < 0.85:
        ci = (speedup * (1.0 - rng.uniform(0.0, 0.15)), speedup * (1.0 + rng.uniform(0.0, 0.5)))
    return make(number, metric, speedup, ci, metric_ci, stages=rng.randint(0, 3),
                runtime=rng.choice(("eager", "onnxruntime")), feasible=rng.random() < 0.85,
                size=float(rng.choice((1, 2, 4))) if sized else None, recipe=f"recipe {rng.randint(0, 20)}")


def random_sets() -> list[list[Candidate]]:
    """:data:`SETS` trial sets of 1 to 12 trials (every trial of one set sized, or none)."""
    rng = random.Random(SEED)
    sets = []
    for _ in range(SETS):
        sized = rng.random() < 0.3
        sets.append([random_candidate(rng, n, sized) for n in range(rng.randint(1, 12))])
    return sets


SETS_OF_TRIALS = random_sets()


def numbers(pool: Sequence[Candidate]) -> set[int]:
    return {c.trial.number for c in pool}


def shown(groups: Sequence[FrontGroup]) -> dict[int, FrontGroup]:
    """Every trial the table shows (leads, repeats, ties), with its group."""
    return {n: g for g in groups for n in (g.lead.trial.number, *g.repeats, *g.tied)}


def test_beats_is_a_strict_partial_order() -> None:
    for pool in SETS_OF_TRIALS:
        won = [[beats(a, b) for b in pool] for a in pool]
        size = len(pool)
        assert not any(won[i][i] for i in range(size)), "irreflexive"
        for i in range(size):
            for j in range(size):
                if won[i][j]:
                    assert all(won[i][k] for k in range(size) if won[j][k]), "transitive"


def test_every_feasible_trial_off_the_front_is_beaten_by_a_front_trial() -> None:
    for pool in SETS_OF_TRIALS:
        front = front_of(pool)
        groups = front_groups(pool)
        assert {g.lead.trial.number for g in groups} | {c.trial.number for g in groups for c in g.folded} == (
            numbers(front)), "every front trial leads or is listed with its lead"
        listed = shown(groups)
        winners = beaten_by(pool, groups)
        for other in pool:
            if other.feasible and other not in front:
                assert any(beats(f, other) for f in front)
                assert other.trial.number in listed or beats(
                    next(f for f in front if f.trial.number == winners[other.trial.number]), other)


def test_adding_a_trial_removes_a_front_trial_only_when_a_front_trial_beats_it() -> None:
    rng = random.Random(SEED + 1)
    for pool in SETS_OF_TRIALS:
        new = random_candidate(rng, len(pool), sized=pool[0].size is not None)
        before, after = front_of(pool), front_of([*pool, new])
        for gone in (c for c in before if c.trial.number not in numbers(after)):
            assert any(beats(f, gone) for f in after)
            assert beats(new, gone), "only the new trial can beat a front trial of the old set"


def test_the_fastest_feasible_trial_is_always_shown() -> None:
    for pool in SETS_OF_TRIALS:
        feasible = [c for c in pool if c.feasible]
        if not feasible:
            continue
        top = max(c.speedup for c in feasible)
        listed = shown(front_groups(pool))
        fastest = [c for c in feasible if c.speedup == top]
        assert any(c.trial.number in listed and listed[c.trial.number].lead.speed.high >= c.speedup
                   for c in fastest)


def test_a_tie_is_listed_only_under_a_lead_whose_intervals_reach_it() -> None:
    for pool in SETS_OF_TRIALS:
        by_number = {c.trial.number: c for c in pool}
        for group in front_groups(pool):
            for member in (by_number[n] for n in (*group.repeats, *group.tied)):
                assert group.lead.speed.high >= member.speedup
                assert member.speed.low <= group.lead.speedup, "a trial clear above the lead's value is its own row"
                assert max(group.lead.metric, *group.lead.metric_ci) >= member.metric
                assert tied(group.lead, member)
            assert all(group.lead.simplicity < member.simplicity for member in group.folded), "the simplest leads"


# --------------------------------------------------------------------------- the digits study


def drop_ci(metric: float, drop: float, half: float = 0.002) -> tuple[float, float]:
    """The metric's interval from a drop interval ``half`` either side of the drop (width 0.004)."""
    return metric_interval(metric, drop, (drop - half, drop + half))


def test_the_fastest_trial_stays_shown_when_a_trial_beats_it_on_the_metric_by_value() -> None:
    """The issue: trial 28 beat 15 on the metric by value, at a tied speed-up, and was folded into 4; 15, faster than
    4, left the front."""
    baseline = make(0, 0.9950, 1.00, (0.99, 1.01), (0.9950, 0.9950), stages=0, recipe="baseline")
    int8 = make(4, 0.9950, 3.78, (3.65, 4.32), drop_ci(0.9950, 0.0), stages=1, runtime="onnxruntime",
                recipe="int8s | ort")
    prune = make(15, 0.9924, 4.77, (4.36, 8.03), drop_ci(0.9924, 0.0026), stages=2, runtime="onnxruntime",
                 recipe="prune 0.3 + distill 200 | ort")
    distill = make(28, 0.9950, 4.35, (4.09, 4.82), drop_ci(0.9950, 0.0), stages=1, runtime="onnxruntime",
                   recipe="distill 400 | ort")
    before = front_groups([baseline, int8, prune])
    assert 15 in shown(before) and 4 in shown(before)
    after = front_groups([baseline, int8, prune, distill])
    listed = shown(after)
    assert 15 in listed and listed[15].lead.speed.high >= 4.77, "15 is shown, under a lead that reaches 4.77x"
    assert not beats(distill, prune), "the metric within its noise: 28 does not beat 15"
    assert 28 in listed and listed[28].lead.trial.number != 4, "4's 4.32x does not reach 28's 4.35x"
    assert {g.lead.trial.number for g in after} >= {4, 28}
