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
each infeasible trial's page, :func:`note_study` lists the real front and the badged
infeasible trials on the study's Note page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from pipeline.search.explain import dominates

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


def badged_infeasible(trials: Sequence[FrozenTrial], directions: Sequence[optuna.study.StudyDirection]
                      ) -> list[FrozenTrial]:
    """The infeasible trials optuna-dashboard 0.21 marks "Best Trial": complete trials no other complete
    trial dominates, constraints ignored."""
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values is not None]
    front = [t for t in complete if not any(dominates(o.values, t.values, directions) for o in complete)]
    return [t for t in front if infeasible(t)]


def study_dashboard_note(study: optuna.Study, front: Sequence[int], allowed_drop: str) -> str:
    """The study's note: the feasible front, and which "Best Trial" badges to ignore. ``allowed_drop``:
    the allowed drop in words (:meth:`pipeline.search.objectives.Objectives.describe_drop`)."""
    badged = badged_infeasible(study.get_trials(deepcopy=False), study.directions)
    lines = [f"**Pareto front** (within the allowed drop of {allowed_drop}): "
             f"trial{'s' if len(front) != 1 else ''} {', '.join(map(str, front)) or 'none'}."]
    if badged:
        numbers = ", ".join(str(t.number) for t in badged)
        lines.append(f'**Ignore the "Best Trial" badge on trial{"s" if len(badged) != 1 else ""} {numbers}**: '
                     "over the allowed drop (each one's note says by how much).")
    lines.append(BADGE_CAVEAT + " Its Pareto-front plot does read the constraints: infeasible trials are grey.")
    return "\n\n".join(lines)


def note_study(study: optuna.Study, front: Sequence[int], allowed_drop: str) -> None:
    """Write :func:`study_dashboard_note` as the study's note (shown on the dashboard's Note page)."""
    from optuna_dashboard import save_note

    save_note(study, study_dashboard_note(study, front, allowed_drop))
