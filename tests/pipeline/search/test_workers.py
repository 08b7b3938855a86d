"""Workers on one study: two optimize commands started together on a fresh results directory, one of them
with ``--workers 2``, finish exactly ``--trials`` trials with no startup race, no duplicate config,
one MLflow parent and one child run per trial."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from paretorch.pipeline.search.duplicates import not_counted

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
TRIALS = 5


def test_two_commands_and_two_workers_start_together(tmp_path: Path) -> None:
    results = tmp_path / "results"
    base = [sys.executable, "-m", "paretorch", "optimize", "--model", "digits", "--trials", str(TRIALS),
            "--latency-budget", "quick", "--runtimes", "eager", "--exports", "none", "--threads", "1",
            "--results-dir", str(results)]
    processes = [subprocess.Popen([*base, *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for extra in (["--workers", "2"], [])]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]

    storage = f"sqlite:///{results / 'optuna.db'}"
    (name,) = optuna.get_all_study_names(storage)
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    finished = [t for t in trials if t.state.is_finished()]
    # A repeat or a trial ruled out before running (a busy machine's probe may rule one out) does not count.
    counted = [t for t in finished if not not_counted(t)]
    assert len(counted) == TRIALS and not [t for t in trials if t.state == TrialState.RUNNING], (
        [(t.number, t.state.name, not_counted(t)) for t in finished])
    keys = collections.Counter(t.user_attrs["paretorch.config_key"] for t in finished
                               if t.state == TrialState.COMPLETE)
    assert max(keys.values()) == 1

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("paretorch/digits").experiment_id])
    parents = [r for r in runs if r.data.tags.get("paretorch.role") == "study"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = collections.Counter(int(r.data.tags["paretorch.trial"]) for r in runs
                                   if r.data.tags.get("paretorch.role") == "trial")
    assert sorted(children) == sorted(t.number for t in finished) and max(children.values()) == 1
