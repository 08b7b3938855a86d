"""Why each trial is where it is: on the front, tied with a front trial, or beaten by which front trial.

Written when a study ends (the front is known only then) as MLflow tags on each trial's
run and as one study user attribute (Optuna does not let finished trials change). "Beaten"
is the front's rule (:mod:`paretorch.pipeline.search.front_rule`: better with confidence, not on point
values); :func:`dominates` is Optuna's point-value dominance, what optuna-dashboard shows.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from paretorch.pipeline.search.front_rule import candidates, first_beater, front_groups


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
