"""What optuna-dashboard needs to read a study as it is.

optuna-dashboard 0.21 reads a trial's constraints only from the older ``constraints``
system attribute (a list); Optuna 5's ``trial.set_constraint`` writes one
``constraints:<name>`` attribute per constraint. :func:`set_constraints` writes both: with
the list, the dashboard's plots grey out infeasible trials.

Its "Best Trial" badge ignores constraints: the server picks the best trials from the
objective values of the complete trials alone (``optuna_dashboard/_app.py``, the
Pareto front of ``get_pareto_front_trials``), and no attribute changes that. A trial over
the allowed drop that is fast enough still gets the badge. What the dashboard does show
is a note (Markdown) per trial and per study: :func:`note_infeasible` explains the badge on
each infeasible trial's page, :func:`note_study` names paretorch's best trials (the front's
leads in the console table's order, :func:`~.pareto.best_trials`) first on the study's Note page,
says why the badge differs and why each badged trial that is not among them is not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.search.front_rule import RULE, dominates
from paretorch.pipeline.search.objectives import ATTR_REASON
from paretorch.pipeline.search.pareto import BestTrial, best_numbers
from paretorch.pipeline.tracking.columns import RANK_METRIC

#: The system attribute optuna-dashboard 0.21 reads (a list of floats, feasible when all <= 0).
LEGACY_CONSTRAINTS_ATTR = "constraints"
#: Where the badge comes from, for the notes.
BADGE_CAVEAT = ('optuna-dashboard 0.21 gives the "Best Trial" badge from the objective values alone and ignores '
                "constraints, so an infeasible trial that is fast enough carries it.")


def set_constraints(trial: optuna.Trial, constraints: Mapping[str, float]) -> None:
    """Set each named constraint (Optuna 5) and the same values as the legacy list (the dashboard)."""
    for name, value in constraints.items():
        trial.set_constraint(name, value)
    trial.storage.set_trial_system_attr(trial._trial_id, LEGACY_CONSTRAINTS_ATTR,
                                        [float(v) for v in constraints.values()])


def note_infeasible(trial: optuna.Trial, reason: str) -> None:
    """The note on an infeasible complete trial's dashboard page: why it is infeasible and what a
    "Best Trial" badge on it means."""
    from optuna_dashboard import save_note

    save_note(trial, f"**Infeasible: {reason}.** Not on paretorch's Pareto front.\n\n{BADGE_CAVEAT}\n\n"
                     "The feasible front: the study's Note page, `make report`, or the `pareto` tag in MLflow.")


def infeasible(trial: FrozenTrial) -> bool:
    """Over a constraint, as the dashboard reads it."""
    return any(v > 0 for v in trial.system_attrs.get(LEGACY_CONSTRAINTS_ATTR, []))


def badged(trials: Sequence[FrozenTrial], directions: Sequence[optuna.study.StudyDirection]) -> list[FrozenTrial]:
    """The trials optuna-dashboard 0.21 marks "Best Trial": complete trials no other complete trial dominates on
    the objective values, constraints ignored."""
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values is not None]
    return [t for t in complete if not any(dominates(o.values, t.values, directions) for o in complete)]


def badged_infeasible(trials: Sequence[FrozenTrial], directions: Sequence[optuna.study.StudyDirection]
                      ) -> list[FrozenTrial]:
    """The badged trials (:func:`badged`) over a constraint: each one's note says why."""
    return [t for t in badged(trials, directions) if infeasible(t)]


def badge_reason(trial: FrozenTrial) -> str:
    """Why a badged trial is not one of paretorch's best: its stored reason (over the allowed drop, latency
    unstable), else the front rule's (no more than a tie with, or beaten by, a front trial)."""
    reason = trial.user_attrs.get(ATTR_REASON) or ("over the allowed drop" if infeasible(trial) else None)
    return reason or "not faster or better than a front trial with confidence (its MLflow run's `tied_with` or " \
                     "`dominated_by` tag names which)"


def study_dashboard_note(study: optuna.Study, best: Sequence[BestTrial], allowed_drop: str,
                         metric_name: str = "metric") -> str:
    """The study's note: paretorch's best trials (:func:`~.pareto.best_trials`, the table's order), and why the
    dashboard's "Best Trial" badges differ. ``allowed_drop``: the allowed drop in words
    (:meth:`paretorch.pipeline.search.objectives.Objectives.describe_drop`); ``metric_name``: the task metric's."""
    lines = [f"**paretorch's best trials: {best_numbers(best)}.** Its Pareto front within the allowed drop of "
             f"{allowed_drop}, fastest first: the console's table lists the same trials in this order, its "
             f"`time to result` line names the first, and the MLflow runs view (`make ui`) sorts them first by "
             f"`{RANK_METRIC}`."]
    lines += [f"{b.rank}. {b.describe(metric_name)}" for b in best]
    mine = {b.number for b in best}
    others = [t for t in badged(study.get_trials(deepcopy=False), study.directions) if t.number not in mine]
    lines.append(f'**The "Best Trial" badge is optuna-dashboard\'s, not paretorch\'s.** {BADGE_CAVEAT} paretorch '
                 f"counts a trial faster only when its speed-up's 95% interval clears the other's ({RULE}), so its "
                 "best trials are the ones above, badged or not.")
    if others:
        lines.append("Badged here but not paretorch's best: "
                     + "; ".join(f"trial {t.number} ({badge_reason(t)})" for t in others) + ".")
    lines.append("Its Pareto-front plot does read the constraints: infeasible trials are grey.")
    return "\n\n".join(lines)


def note_study(study: optuna.Study, best: Sequence[BestTrial], allowed_drop: str, metric_name: str = "metric") -> None:
    """Write :func:`study_dashboard_note` as the study's note (shown on the dashboard's Note page)."""
    from optuna_dashboard import save_note

    save_note(study, study_dashboard_note(study, best, allowed_drop, metric_name))
