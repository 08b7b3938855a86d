"""The trial loop (:func:`paretorch.pipeline.search.workers.run_trials`) on Optuna's ask-and-tell interface, with a fake
objective: enqueued trials run first, each record reaches the callbacks as the objective returned it, every
way a trial ends is told to the study (values, pruned, failed, an error outside the objective), Ctrl-C leaves no
trial RUNNING (even a second one while the first is recorded), and the heartbeat runs for the trial's length."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.search.config import finished_states
from paretorch.pipeline.search.duplicates import TrialBudget
from paretorch.pipeline.search.record import COMPLETE, FAIL, PRUNED, TrialOutcome, TrialRecord
from paretorch.pipeline.search.storage import StudyLock, heartbeat, open_storage, retried
from paretorch.pipeline.search.workers import run_trials

Ending = Callable[[optuna.Trial, float], TrialOutcome]


def _study(tmp_path: Path) -> tuple[optuna.Study, StudyLock]:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    storage = open_storage(url)  # heartbeats on, as in a search
    study = optuna.create_study(study_name="loop", storage=storage, directions=["maximize", "minimize"],
                                sampler=optuna.samplers.RandomSampler(seed=0))
    return study, StudyLock(url, storage, "loop")


def _complete(trial: optuna.Trial, x: float) -> TrialOutcome:
    return TrialOutcome(TrialRecord(number=trial.number, state=COMPLETE, runtime="eager"), values=(x, 2 * x))


class Objective:
    """Suggests ``x`` and ends each trial as ``endings`` (by trial number, default complete) says."""

    def __init__(self, endings: dict[int, Ending] | None = None) -> None:
        self.endings = endings or {}
        self.returned: dict[int, TrialOutcome] = {}

    def __call__(self, trial: optuna.Trial) -> TrialOutcome:
        x = trial.suggest_float("x", 0.0, 10.0)
        outcome = self.endings.get(trial.number, _complete)(trial, x)
        self.returned[trial.number] = outcome
        return outcome


class Seen:
    """A callback: the finished trial and the record it was handed, and the trial's state at that moment."""

    def __init__(self) -> None:
        self.calls: list[tuple[FrozenTrial, TrialRecord]] = []

    def __call__(self, study: optuna.Study, trial: FrozenTrial, record: TrialRecord) -> None:
        assert study.get_trials(deepcopy=False)[trial.number].state.is_finished(), "told before the callbacks"
        self.calls.append((trial, record))


def test_enqueued_trials_run_first_and_each_record_reaches_the_callbacks_as_returned(tmp_path: Path) -> None:
    study, lock = _study(tmp_path)
    study.enqueue_trial({"x": 7.5}, user_attrs={"paretorch.seed": "first"})
    study.enqueue_trial({"x": 2.5})
    objective, seen = Objective(), Seen()
    interrupted = run_trials(objective, lock, study, TrialBudget(3, finished_states()), None, [seen])
    assert not interrupted and not lock.held
    trials = study.get_trials(deepcopy=False)
    assert [t.params["x"] for t in trials[:2]] == [7.5, 2.5], "the enqueued trials ran first, in order"
    assert trials[0].user_attrs["paretorch.seed"] == "first" and "paretorch.worker" in trials[0].user_attrs
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert trials[0].values == [7.5, 15.0], "both objectives told"
    assert [trial.number for trial, _ in seen.calls] == [0, 1, 2]
    assert all(record is objective.returned[trial.number].record for trial, record in seen.calls)


def test_every_ending_is_told_and_an_error_outside_the_steps_does_not_stop_the_study(tmp_path: Path) -> None:
    def pruned(trial: optuna.Trial, x: float) -> TrialOutcome:
        return TrialOutcome(TrialRecord(number=trial.number, state=PRUNED, runtime="eager", infeasible="no"))

    def failed(trial: optuna.Trial, x: float) -> TrialOutcome:
        error = RuntimeError("stage broke")
        return TrialOutcome(TrialRecord(number=trial.number, state=FAIL, runtime="eager", error="x"), failure=error)

    def nan(trial: optuna.Trial, x: float) -> TrialOutcome:
        return TrialOutcome(TrialRecord(number=trial.number, state=COMPLETE, runtime="eager"), values=(math.nan, 1.0))

    def broken(trial: optuna.Trial, x: float) -> TrialOutcome:
        raise ValueError("outside the objective's steps")

    def raised_pruned(trial: optuna.Trial, x: float) -> TrialOutcome:
        raise optuna.TrialPruned("pruned by a stage")

    study, lock = _study(tmp_path)
    objective, seen = Objective({0: pruned, 1: failed, 2: nan, 3: broken, 4: raised_pruned}), Seen()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_trials(objective, lock, study, TrialBudget(6, finished_states()), None, [seen])
    assert not [w for w in caught if "Heartbeat" in str(w.message) or "nan" in str(w.message)], \
        [str(w.message) for w in caught]
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [TrialState.PRUNED, TrialState.FAIL, TrialState.FAIL, TrialState.FAIL, TrialState.PRUNED,
                      TrialState.COMPLETE]
    records = {trial.number: record for trial, record in seen.calls}
    assert records[1] is objective.returned[1].record
    assert records[3].state == FAIL and 3 not in objective.returned, "read back from storage"
    assert "ValueError: outside the objective's steps" in (records[3].error or ""), "its traceback kept, not swallowed"
    assert records[4].state == PRUNED


def test_ctrl_c_in_a_trial_leaves_nothing_running_and_its_config_runs_again(tmp_path: Path) -> None:
    def interrupt(trial: optuna.Trial, x: float) -> TrialOutcome:
        raise KeyboardInterrupt

    study, lock = _study(tmp_path)
    study.enqueue_trial({"x": 4.0})
    seen = Seen()
    assert run_trials(Objective({1: interrupt}), lock, study, TrialBudget(5, finished_states()), None, [seen])
    assert not lock.held
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    assert trials[2].params == trials[1].params, "its config enqueued again"
    assert retried(trials) == {1} and TrialBudget(5, finished_states()).counted(study) == 1
    assert [trial.number for trial, _ in seen.calls] == [0], "no callback for the interrupted trial"

    # the rerun picks the interrupted config up first
    run_trials(Objective(), lock, study, TrialBudget(2, finished_states()), None, [seen])
    assert study.get_trials(deepcopy=False)[2].params["x"] == trials[1].params["x"]


def test_an_interrupted_config_runs_before_the_seeds_still_waiting(tmp_path: Path) -> None:
    """Ctrl-C in the first of three seeds: the next invocation runs the interrupted config first, not after the
    two seeds enqueued before it (Optuna's queue runs waiting trials by number)."""
    def interrupt(trial: optuna.Trial, x: float) -> TrialOutcome:
        raise KeyboardInterrupt

    study, lock = _study(tmp_path)
    for x in (1.0, 2.0, 3.0):
        study.enqueue_trial({"x": x})
    assert run_trials(Objective({0: interrupt}), lock, study, TrialBudget(5, finished_states()), None, [])
    run_trials(Objective(), lock, study, TrialBudget(1, finished_states()), None, [])
    trials = study.get_trials(deepcopy=False)
    assert trials[0].state == TrialState.FAIL and retried(trials) == {0}
    (first,) = [t for t in trials if t.state == TrialState.COMPLETE]
    assert first.params["x"] == 1.0 and first.number == 3, "the retry (enqueued last) ran first"
    waiting = [t.system_attrs["fixed_params"]["x"] for t in trials if t.state == TrialState.WAITING]
    assert waiting == [2.0, 3.0], "the seeds wait, in order"


def test_a_second_ctrl_c_while_the_first_is_told_leaves_nothing_running(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(trial: optuna.Trial, x: float) -> TrialOutcome:
        raise KeyboardInterrupt

    def tell_interrupted(*args: object, **kwargs: object) -> FrozenTrial:
        raise KeyboardInterrupt  # the second Ctrl-C lands while the interrupted trial is told FAIL

    study, lock = _study(tmp_path)
    monkeypatch.setattr(study, "tell", tell_interrupted)
    assert run_trials(Objective({0: interrupt}), lock, study, TrialBudget(3, finished_states()), None, [])
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]


def test_no_trial_starts_past_the_timeout_or_the_budget(tmp_path: Path) -> None:
    study, lock = _study(tmp_path)
    assert not run_trials(Objective(), lock, study, TrialBudget(3, finished_states()), 0.0, [])
    assert study.get_trials(deepcopy=False) == []
    budget = TrialBudget(3, finished_states())
    budget.exhausted = True
    assert not run_trials(Objective(), lock, study, budget, None, [])
    assert study.get_trials(deepcopy=False) == []


def test_the_heartbeat_runs_for_the_trial_and_stops_with_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'beat.db'}"
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=3)
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    with heartbeat(study, trial):
        time.sleep(4.0)
        assert storage._get_stale_trial_ids(study._study_id) == [], "beating: not stale past the grace period"
    time.sleep(4.5)
    assert storage._get_stale_trial_ids(study._study_id) == [trial._trial_id], "stopped with the block"
    study.tell(trial, state=TrialState.FAIL)
