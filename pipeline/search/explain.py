"""Why each trial is where it is: on the front, or dominated by which front trial.

Written when a study ends (the front is known only then) as MLflow tags on each trial's
run and as one study user attribute (Optuna does not let finished trials change).
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState


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
    """For each complete trial off ``front``: the front trial that dominates it (the first by number).
    A trial no front trial dominates (an infeasible one that is better in some objective) is left out."""
    numbers = {t.number for t in front}
    ordered = sorted(front, key=lambda t: t.number)
    result: dict[int, int] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if trial.number in numbers or trial.values is None:
            continue
        winner = next((f for f in ordered if dominates(f.values, trial.values, study.directions)), None)
        if winner is not None:
            result[trial.number] = winner.number
    return result


def front_tags(study: optuna.Study, distinct: Sequence[tuple[FrozenTrial, list[int]]],
               dominated: dict[int, int]) -> dict[int, dict[str, str]]:
    """MLflow tags per trial: ``pareto`` (once per distinct recipe), ``same_as`` for a front trial
    that repeats an earlier one's recipe and numbers, ``dominated_by`` for the others."""
    tags: dict[int, dict[str, str]] = {}
    for trial, repeats in distinct:
        tags[trial.number] = {"pareto": "true"}
        for number in repeats:
            tags[number] = {"pareto": "false", "same_as": str(trial.number)}
    for number, winner in dominated.items():
        tags[number] = {"pareto": "false", "dominated_by": str(winner)}
    return tags
