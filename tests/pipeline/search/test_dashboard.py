"""optuna-dashboard 0.21 over a constrained study: what it badges "Best Trial", and the notes that say which
badges to ignore (read back through the dashboard's own JSON API)."""

from __future__ import annotations

import math

import optuna
import pytest

from paretorch.pipeline.search.dashboard import (
    badged,
    badged_infeasible,
    note_infeasible,
    note_study,
    set_constraints,
    study_dashboard_note,
)
from paretorch.pipeline.search.pareto import BestTrial, ParetoRow
from tests.pipeline.search.conftest import study_detail

#: (accuracy, latency ms, drop): trial 1 is the fastest but over the allowed drop of 0.01.
TRIALS = [(0.99, 1.0, 0.0), (0.80, 0.5, 0.19), (0.99, 2.0, 0.0), (0.985, 0.8, 0.005)]
MAX_DROP = 0.01


def objective(trial: optuna.Trial) -> tuple[float, float]:
    accuracy, latency, drop = TRIALS[trial.number]
    set_constraints(trial, {"metric_drop": drop - MAX_DROP})
    if drop > MAX_DROP:
        note_infeasible(trial, f"drop {drop:.4f} > allowed {MAX_DROP:g}")
    return accuracy, latency


def test_the_dashboard_badges_an_infeasible_trial_and_the_notes_say_so() -> None:
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, directions=["maximize", "minimize"])
    study.optimize(objective, n_trials=len(TRIALS))
    front = [t.number for t in study.best_trials]
    assert front == [0, 3], "Optuna's front honours the constraint"
    assert [t.number for t in badged(study.trials, study.directions)] == [0, 1, 3]
    assert [t.number for t in badged_infeasible(study.trials, study.directions)] == [1]
    note_study(study, best_of(3, 0), str(MAX_DROP), "accuracy")

    detail = study_detail(storage, study._study_id)
    best = {t["number"] for t in detail["best_trials"]}
    assert best == {0, 1, 3}, "optuna-dashboard 0.21 ignores constraints when it picks best trials"
    trials = {t["number"]: t for t in detail["trials"]}
    assert trials[1]["constraints"] == [pytest.approx(0.18)], "the legacy list it reads for its plots"
    assert trials[1]["note"]["body"].startswith("**Infeasible: drop 0.1900 > allowed 0.01.**")
    assert "ignores constraints" in trials[1]["note"]["body"]
    assert trials[0]["note"]["body"] == "", "feasible trials get no note"
    note = detail["note"]["body"]
    assert note.startswith("**paretorch's best trials: 3, then 0.**")
    assert "\n\n1. trial 3: 1.25x, accuracy 0.9850, fast\n\n2. trial 0: 1.00x, accuracy 0.9900, baseline" in note
    assert "Badged here but not paretorch's best: trial 1 (over the allowed drop)." in note


def best_of(*numbers: int) -> list[BestTrial]:
    """paretorch's best trials of :data:`TRIALS` in this order (speed-up: 1 / latency)."""
    return [BestTrial(rank, ParetoRow(trial=n, metric=TRIALS[n][0], drop=TRIALS[n][2], latency_ms=TRIALS[n][1],
                                      speedup=1.0 / TRIALS[n][1], size_bytes=math.nan, exports="",
                                      recipe="baseline" if n == 0 else "fast"))
            for rank, n in enumerate(numbers, start=1)]


def test_no_badge_list_when_every_badged_trial_is_among_the_best() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.optimize(objective, n_trials=1)
    note = study_dashboard_note(study, best_of(0), str(MAX_DROP))
    assert note.startswith("**paretorch's best trials: 0.** Its Pareto front within the allowed drop of 0.01")
    assert "Badged here" not in note and 'The "Best Trial" badge is optuna-dashboard\'s' in note
