"""optuna-dashboard 0.21 over a constrained study: what it badges "Best Trial", and the notes that say which
badges to ignore (read back through the dashboard's own JSON API)."""

from __future__ import annotations

import io
import json
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
from optuna_dashboard import wsgi

from pipeline.search.dashboard import (
    badged_infeasible,
    note_infeasible,
    note_study,
    set_constraints,
    study_dashboard_note,
)

#: (accuracy, latency ms, drop): trial 1 is the fastest but over the allowed drop of 0.01.
TRIALS = [(0.99, 1.0, 0.0), (0.80, 0.5, 0.19), (0.99, 2.0, 0.0), (0.985, 0.8, 0.005)]
MAX_DROP = 0.01


def objective(trial: optuna.Trial) -> tuple[float, float]:
    accuracy, latency, drop = TRIALS[trial.number]
    set_constraints(trial, {"metric_drop": drop - MAX_DROP})
    if drop > MAX_DROP:
        note_infeasible(trial, f"drop {drop:.4f} > allowed {MAX_DROP:g}")
    return accuracy, latency


def study_detail(storage: optuna.storages.BaseStorage, study_id: int) -> dict:
    environ: dict = {"PATH_INFO": f"/api/studies/{study_id}", "QUERY_STRING": "after=0", "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(wsgi(storage)(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status[0].startswith("200"), status
    return json.loads(body)


def test_the_dashboard_badges_an_infeasible_trial_and_the_notes_say_so() -> None:
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, directions=["maximize", "minimize"])
    study.optimize(objective, n_trials=len(TRIALS))
    front = [t.number for t in study.best_trials]
    assert front == [0, 3], "Optuna's front honours the constraint"
    assert [t.number for t in badged_infeasible(study.trials, study.directions)] == [1]
    note_study(study, front, str(MAX_DROP))

    detail = study_detail(storage, study._study_id)
    best = {t["number"] for t in detail["best_trials"]}
    assert best == {0, 1, 3}, "optuna-dashboard 0.21 ignores constraints when it picks best trials"
    trials = {t["number"]: t for t in detail["trials"]}
    assert trials[1]["constraints"] == [pytest.approx(0.18)], "the legacy list it reads for its plots"
    assert trials[1]["note"]["body"].startswith("**Infeasible: drop 0.1900 > allowed 0.01.**")
    assert "ignores constraints" in trials[1]["note"]["body"]
    assert trials[0]["note"]["body"] == "", "feasible trials get no note"
    note = detail["note"]["body"]
    assert "trials 0, 3." in note and 'Ignore the "Best Trial" badge on trial 1**' in note


def test_no_badge_warning_when_every_badged_trial_is_feasible() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.optimize(objective, n_trials=1)
    assert badged_infeasible(study.trials, study.directions) == []
    note = study_dashboard_note(study, [0], str(MAX_DROP))
    assert note.startswith("**Pareto front** (within the allowed drop of 0.01): trial 0.") and "Ignore" not in note
