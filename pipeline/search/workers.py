"""Several workers on one study: the gated trial loop, config claims and the worker processes.

* :func:`run_trials` starts trials one at a time while fewer than ``trials`` are finished or running,
  counting and starting under the study lock, so N workers finish exactly ``trials`` trials;
* :func:`claim_config` marks a trial's config; a config that another trial already runs or ran
  is not run again (the later trial is pruned as "same config as trial N");
* :func:`launch_workers` runs ``optimize`` in N processes on one study (``--workers N``), after the
  calling process has created the study, the baseline and the MLflow parent run.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from pipeline.search.duplicates import TrialBudget
from pipeline.search.record import TrialOutcome, TrialRecord
from pipeline.search.storage import ATTR_WORKER, StudyLock, fail_dead_trials, retry_trial, worker_id

if TYPE_CHECKING:
    from rich.console import Console

#: User attribute: a digest of the trial's per-node configs and runtime.
ATTR_CONFIG_KEY = "paretorch.config_key"
#: Hidden option that makes ``optimize`` one worker of a study that its parent process prepared.
WORKER_FLAG = "--worker-index"

#: Runs one trial and hands back its outcome (:class:`pipeline.search.trial_objective.TrialObjective`).
Objective = Callable[[optuna.Trial], TrialOutcome]
#: Called after each trial the loop ran, with the record the objective handed back.
Callback = Callable[[optuna.Study, FrozenTrial, TrialRecord], None]


def claim_config(trial: optuna.Trial, configs: dict[str, Any], runtime: str) -> int | None:
    """Record the trial's config; the number of an earlier trial (running, complete or pruned) with the same
    config, if any. Of two trials that start together with one config, the later start is the duplicate."""
    key = hashlib.sha256(json.dumps({"configs": configs, "runtime": runtime}, sort_keys=True,
                                    default=str).encode()).hexdigest()[:16]
    trial.set_user_attr(ATTR_CONFIG_KEY, key)
    mine = (trial.datetime_start.timestamp() if trial.datetime_start else 0.0, trial.number)
    states = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
    earlier = [t.number for t in trial.study.get_trials(deepcopy=False, states=states)
               if t.number != trial.number and t.user_attrs.get(ATTR_CONFIG_KEY) == key
               and (t.state != TrialState.RUNNING
                    or (t.datetime_start.timestamp() if t.datetime_start else 0.0, t.number) < mine)]
    return min(earlier) if earlier else None


def counted_trials(study: optuna.Study, budget: TrialBudget) -> int:
    """Trials that count toward the study's total: finished (repeats not counted) or running."""
    return budget.counted(study) + len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def run_trials(objective: Objective, lock: StudyLock, study: optuna.Study, budget: TrialBudget,
               timeout: float | None, callbacks: Sequence[Callback]) -> bool:
    """Run trials until ``budget.total`` are finished or running (all workers together), the budget is
    exhausted (only repeats proposed) or ``timeout`` passes; True if interrupted (Ctrl-C). The interrupted
    trial is marked FAIL and its config enqueued again; it does not count (:func:`~pipeline.search.storage.retried`).

    Each trial's record goes from ``objective`` straight to ``callbacks`` (then the budget), once the trial
    is finished in the study; a trial that ended without one (an error outside the objective's steps) is
    read back from storage."""
    deadline = time.monotonic() + timeout if timeout is not None else None
    current: list[int] = []
    handed: list[TrialOutcome] = []  # this optimize call's one trial, as the objective returned it

    def run(trial: optuna.Trial) -> tuple[float, ...]:
        trial.set_user_attr(ATTR_WORKER, worker_id())
        current.append(trial.number)
        lock.release()  # the trial is RUNNING: it counts; other workers may start theirs
        outcome = objective(trial)
        handed.append(outcome)
        return outcome.optuna_result()

    def finished(study: optuna.Study, trial: FrozenTrial) -> None:
        record = handed[-1].record if handed and handed[-1].record.number == trial.number \
            else TrialRecord.from_trial(trial)
        for callback in callbacks:
            callback(study, trial, record)
        budget(study, trial)

    try:
        while deadline is None or time.monotonic() < deadline:
            lock.acquire()
            try:
                fail_dead_trials(study)
                if budget.exhausted or counted_trials(study, budget) >= budget.total:
                    return False
                handed.clear()
                study.optimize(run, n_trials=1, catch=(Exception,), callbacks=[finished])
            finally:
                lock.release()
    except KeyboardInterrupt:  # a second Ctrl-C is held off meanwhile (interrupt.stopping, around the search)
        if current:
            retry_trial(study, current[-1])
        return True
    return False


def worker_argv(argv: Sequence[str], index: int) -> list[str]:
    """The command line of worker ``index``: the user's, with one worker and the worker's index."""
    return [*argv, "--workers", "1", WORKER_FLAG, str(index)]


def launch_workers(argv: Sequence[str], workers: int, console: Console) -> tuple[bool, list[str]]:
    """Run ``python -m pipeline <argv>`` as ``workers`` worker processes and wait for them all;
    (interrupted, notes on workers that failed)."""
    console.print(f"starting {workers} workers on one study")
    processes = [subprocess.Popen([sys.executable, "-m", "pipeline", *worker_argv(argv, i)])
                 for i in range(workers)]
    interrupted = False
    codes: list[int | None] = [None] * workers
    while None in codes:  # poll them all: a worker that died is reaped at once, so others see its pid gone
        try:
            codes = [p.poll() for p in processes]
            time.sleep(0.2)
        except KeyboardInterrupt:  # the workers got the same Ctrl-C; wait for them to stop cleanly
            interrupted = True
    notes = [f"worker {i} exited with status {code}" for i, code in enumerate(codes) if code not in (0, 130)]
    return interrupted or any(code == 130 for code in codes), notes
