"""What optuna-dashboard needs to read a study as it is.

optuna-dashboard 0.21 reads a trial's constraints only from the older ``constraints``
system attribute (a list); Optuna 5's ``trial.set_constraint`` writes one
``constraints:<name>`` attribute per constraint. Without the list, the dashboard
shows infeasible trials as "Best". :func:`set_constraints` writes both.
"""

from __future__ import annotations

from collections.abc import Mapping

import optuna

#: The system attribute optuna-dashboard 0.21 reads (a list of floats, feasible when all <= 0).
LEGACY_CONSTRAINTS_ATTR = "constraints"


def set_constraints(trial: optuna.Trial, constraints: Mapping[str, float]) -> None:
    """Set each named constraint (Optuna 5) and the same values as the legacy list (the dashboard)."""
    for name, value in constraints.items():
        trial.set_constraint(name, value)
    trial.storage.set_trial_system_attr(trial._trial_id, LEGACY_CONSTRAINTS_ATTR,
                                        [float(v) for v in constraints.values()])

