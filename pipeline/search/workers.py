"""Several workers on one study: the gated trial loop, config claims and the worker processes.

* :func:`run_trials` starts trials one at a time while fewer than ``trials`` are finished or running,
  counting and starting under the study lock, so N workers finish exactly ``trials`` trials; each trial is
  asked for, run and told (Optuna's ask-and-tell: :func:`ask`, :func:`run_trial`, :func:`tell`), so the
  objective's :class:`~paretorch.pipeline.search.record.TrialOutcome` reaches the callbacks as a return value;
* :func:`claim_config` marks a trial's config; a config that another trial already runs or ran
  is not run again (the later trial is pruned as "same config as trial N");
* :func:`launch_workers` runs ``optimize`` in N processes on one study (``--workers N``), after the
  calling process has created the study, the baseline and the MLflow parent run.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.core.names import WORKER_FLAG
from paretorch.pipeline.search.duplicates import TrialBudget
from paretorch.pipeline.search.interrupt import release, releasing
from paretorch.pipeline.search.objectives import ATTR_TRACEBACK, TRACEBACK_CHARS
from paretorch.pipeline.search.record import TrialOutcome, TrialRecord
from paretorch.pipeline.search.storage import (
    ATTR_WORKER,
    StudyLock,
    fail_dead_trials,
    heartbeat,
    retry_trial,
    worker_id,
)

if TYPE_CHECKING:
    from rich.console import Console

#: User attribute: a digest of the trial's per-node configs and runtime.
ATTR_CONFIG_KEY = "paretorch.config_key"

#: Runs one trial and hands back its outcome (:class:`paretorch.pipeline.search.trial_objective.TrialObjective`).
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
    trial is marked FAIL and its config enqueued again; it does not count
    (:func:`~paretorch.pipeline.search.storage.retried`).

    Each trial is asked for (an enqueued one first), run and told through Optuna's ask-and-tell interface
    (:func:`run_trial`), so its record goes from ``objective`` straight to ``callbacks`` (then the budget) as a
    value, once the trial is finished in the study."""
    deadline = time.monotonic() + timeout if timeout is not None else None
    current: int | None = None  # the number of the trial this loop asked for last
    try:
        while deadline is None or time.monotonic() < deadline:
            lock.acquire()
            try:
                fail_dead_trials(study)
                if budget.exhausted or counted_trials(study, budget) >= budget.total:
                    return False
                trial = ask(study)
                current = trial.number
                trial.set_user_attr(ATTR_WORKER, worker_id())
            finally:
                lock.release()  # the trial is RUNNING: it counts; other workers may start theirs
            finished, record = run_trial(objective, study, trial)
            for callback in callbacks:
                callback(study, finished, record)
            budget(study, finished)
    except KeyboardInterrupt as exc:  # a second Ctrl-C is held off meanwhile (interrupt.stopping, around the search)
        release(exc)  # a write it cut short (a callback's MLflow run) holds its database's lock until then
        if current is not None:
            retry_trial(study, current)
        return True
    return False


def ask(study: optuna.Study) -> optuna.Trial:
    """The study's next trial, RUNNING: an interrupted or killed trial's retry first (:func:`retry_first`), then an
    enqueued one (its fixed params and user attributes), else a new one. Call under the study lock. The heartbeat
    that ``Study.optimize`` keeps runs in :func:`run_trial`."""
    if (retry := retry_first(study)) is not None:
        return retry
    with warnings.catch_warnings():  # Optuna warns that ask-and-tell sends no heartbeats: run_trial sends them
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        return study.ask()


def retry_first(study: optuna.Study) -> optuna.Trial | None:
    """The oldest waiting retry of an interrupted or killed trial (Optuna's retry callback marks it with a
    ``retry_history``), taken RUNNING, as ``Study.ask`` takes a waiting trial; None when there is none. Optuna's
    queue runs waiting trials by number, and the retry was enqueued after the seeds and presets still waiting:
    taken here, the configuration the user interrupted runs first on the next invocation, as promised."""
    for waiting in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if not waiting.system_attrs.get("retry_history"):
            continue
        try:
            if study._storage.set_trial_state_values(waiting._trial_id, state=TrialState.RUNNING):
                return optuna.Trial(study, waiting._trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker ran it meanwhile
            continue
    return None


def run_trial(objective: Objective, study: optuna.Study, trial: optuna.Trial) -> tuple[FrozenTrial, TrialRecord]:
    """Run ``objective`` on ``trial`` (its heartbeat recorded meanwhile) and tell the study how it ended, as
    ``Study.optimize(catch=(Exception,))`` would: the outcome's values (COMPLETE), PRUNED or FAIL. An exception
    outside the objective's steps fails the trial and its record is read back from storage; ``KeyboardInterrupt``
    fails it and is raised, so no trial is left RUNNING (what the interrupted code held released first, before the
    heartbeat thread's next write: :func:`~paretorch.pipeline.search.interrupt.releasing`). The finished trial and its
    record."""
    try:
        with heartbeat(study, trial), releasing():
            outcome = objective(trial)
    except optuna.TrialPruned:
        finished = study.tell(trial, state=TrialState.PRUNED)
    except Exception:  # optimize's catch=(Exception,): the trial fails with its traceback, the study goes on
        trial.set_user_attr(ATTR_TRACEBACK, traceback.format_exc()[-TRACEBACK_CHARS:])
        finished = study.tell(trial, state=TrialState.FAIL)
    except KeyboardInterrupt:
        study.tell(trial, state=TrialState.FAIL)
        raise
    else:
        return tell(study, trial, outcome), outcome.record
    return finished, TrialRecord.from_trial(finished)


def tell(study: optuna.Study, trial: optuna.Trial, outcome: TrialOutcome) -> FrozenTrial:
    """Finish ``trial`` in the study as ``outcome`` ended it: its values (COMPLETE; FAIL where Optuna would reject
    them, as ``optimize`` fails them: a NaN, not one value per objective), FAIL for a failure, else PRUNED."""
    values = outcome.values
    if values is not None and len(values) == len(study.directions) and not any(math.isnan(v) for v in values):
        return study.tell(trial, values)
    return study.tell(trial, state=TrialState.PRUNED if values is None and outcome.failure is None
                      else TrialState.FAIL)


def worker_argv(argv: Sequence[str], index: int) -> list[str]:
    """The command line of worker ``index``: the user's, with one worker and the worker's index."""
    return [*argv, "--workers", "1", WORKER_FLAG, str(index)]


def worker_command(argv: Sequence[str], index: int) -> list[str]:
    """The process of worker ``index``. ``-P``: the working directory is not put on sys.path, so a user's
    pipeline.py or experiments/ there cannot shadow the installed package (as it cannot in the ``paretorch``
    command)."""
    return [sys.executable, "-P", "-m", "paretorch", *worker_argv(argv, index)]


def launch_workers(argv: Sequence[str], workers: int, console: Console) -> tuple[bool, list[str]]:
    """Run ``python -m paretorch <argv>`` as ``workers`` worker processes and wait for them all;
    (interrupted, notes on workers that failed)."""
    console.print(f"starting {workers} workers on one study")
    processes = [subprocess.Popen(worker_command(argv, i)) for i in range(workers)]
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
