"""Ctrl-C and kill -9 during a trial, then a rerun: one line, the trial FAIL, its seed retried once and the trial not
counted toward --trials, MLflow closed.

Two slow seeds (pruning with 1000 fine-tuning steps) on digits: the first run is interrupted (SIGINT) during
seed A, the second is killed (SIGKILL) during seed B, the third finishes the study.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from tests.cpu_seconds import stop

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
SEARCH_YAML = """
runtimes: [eager]
latency_budget: quick
exports: none
sampler: random
seeds:
  - name: slow-a
    stages: [{stage: prune, ratio: 0.3, finetune_steps: 1000}]
  - name: slow-b
    stages: [{stage: prune, ratio: 0.2, finetune_steps: 1000}]
"""


class Study:
    def __init__(self, tmp: Path) -> None:
        self.config = tmp / "search.yaml"
        self.config.write_text(SEARCH_YAML)
        self.storage = f"sqlite:///{tmp / 'optuna.db'}"
        self.tracking = f"sqlite:///{tmp / 'mlflow.db'}"
        self.name = f"crash-{os.getpid()}"

    def command(self, trials: int) -> list[str]:
        return [sys.executable, "-m", "paretorch", "optimize", "--model", "digits", "--search-config",
                str(self.config), "--storage", self.storage, "--tracking-uri", self.tracking, "--study-name",
                self.name, "--trials", str(trials), "--threads", "1"]

    def start(self, trials: int) -> subprocess.Popen[str]:
        # A shell's background job (CI runners, `nohup ... &`) starts with SIGINT ignored, and a
        # Python started with SIGINT ignored never raises KeyboardInterrupt: give the study the
        # default disposition a terminal's Ctrl-C meets.
        return subprocess.Popen(self.command(trials), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True, preexec_fn=default_sigint)

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        if self.name not in optuna.get_all_study_names(self.storage):
            return []
        return optuna.load_study(study_name=self.name, storage=self.storage).get_trials(deepcopy=False)

    def wait_running(self, seed: str, process: subprocess.Popen[str], limit: float = 240.0) -> int:
        """The number of the trial of ``seed`` once it is RUNNING (fine-tuning)."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            for trial in self.trials():
                if trial.state == TrialState.RUNNING and trial.user_attrs.get("paretorch.seed") == seed:
                    time.sleep(2.0)  # well inside the fine-tuning
                    return trial.number
            assert process.poll() is None, process.communicate()[0]
            time.sleep(0.5)
        raise AssertionError(f"seed {seed} never ran")


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_interrupt_and_kill_then_rerun(tmp_path: Path) -> None:
    study = Study(tmp_path)

    first = study.start(trials=9)
    interrupted = study.wait_running("slow-a", first)
    stopped = stop(first, lambda: os.killpg(first.pid, signal.SIGINT), timeout=180)
    output = stopped.output
    # No export, no re-measure: what is done is recorded at once (CPU seconds; wall seconds far below the fine-tuning).
    assert stopped.cpu_seconds < 2.0 and stopped.wall_seconds < 20.0, (stopped.cpu_seconds, stopped.wall_seconds,
                                                                        output)
    assert first.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert sum(line.startswith("interrupted") for line in output.splitlines()) == 1, output

    second = study.start(trials=9)
    killed = study.wait_running("slow-b", second)
    os.killpg(second.pid, signal.SIGKILL)
    second.wait(timeout=60)
    assert {t.number: t.state for t in study.trials()}[killed] == TrialState.RUNNING  # what kill -9 leaves

    third = subprocess.run(study.command(trials=5), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stdout + third.stderr
    trials = {t.number: t for t in study.trials()}
    assert trials[interrupted].state == TrialState.FAIL and trials[killed].state == TrialState.FAIL
    retries = {t.system_attrs.get("failed_trial"): t for t in trials.values() if "failed_trial" in t.system_attrs}
    assert set(retries) == {interrupted, killed}  # each config retried exactly once
    assert retries[interrupted].user_attrs["paretorch.seed"] == "slow-a"
    assert retries[killed].user_attrs["paretorch.seed"] == "slow-b"
    assert all(t.state == TrialState.COMPLETE for t in retries.values())
    finished = [t for t in trials.values() if t.state.is_finished()]
    counted = [t for t in finished if t.number not in (interrupted, killed)]
    assert len(counted) == 5, "--trials 5: the interrupted and the killed trial do not count, their retries do"
    assert not [t for t in trials.values() if t.state == TrialState.RUNNING]

    client = MlflowClient(tracking_uri=study.tracking)
    runs = client.search_runs([client.get_experiment_by_name("paretorch/digits").experiment_id])
    parents = [r for r in runs if r.data.tags.get("paretorch.role") == "study"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = {int(r.data.tags["paretorch.trial"]): r.info.status for r in runs
                if r.data.tags.get("paretorch.role") == "trial"}
    assert sorted(children) == sorted(t.number for t in counted), "an interrupted or killed trial has no run"
    assert set(children.values()) <= {"FINISHED", "KILLED"}
