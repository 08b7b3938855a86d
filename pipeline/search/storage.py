"""Optuna storages that several workers can share, and the lock that serializes their startup and trial starts.

* ``sqlite:///PATH`` (the default, one machine): a 60 s busy timeout, heartbeats;
* ``journal:PATH`` (one machine, Optuna's journal file): no heartbeats (stale trials are found by process id);
* ``postgresql://...`` (several machines; the ``postgresql`` extra installs psycopg): heartbeats.

A trial whose process died is marked FAIL the next time any worker starts (heartbeats older than
:data:`GRACE_S`, or a dead process id on this host) and its config is enqueued once more
(:class:`~optuna.storages.RetryHeartbeatStaleTrialCallback`); an interrupted trial's config is enqueued
again every time (:func:`retry_trial`). Neither counts toward the study's trials (:func:`retried`). Each retry
says why its configuration runs again (:data:`ATTR_RERUN`: :data:`INTERRUPTED` or :data:`DIED`), which a resumed
study prints first, before the retry runs (:func:`rerun_lines`, one line each:
``resuming: trial 7 (prune 0.3 | ort) is run again: its process died (left RUNNING)``).

:func:`study_lock` is an exclusive lock per study: a file lock beside a local storage, a PostgreSQL
advisory lock for a server. Workers hold it to create the schema and the study, and from "how many
trials are finished or running?" until their next trial is RUNNING, so a study never overshoots.
"""

from __future__ import annotations

import copy
import hashlib
import os
import socket
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import optuna
from filelock import FileLock
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import text
from sqlalchemy.engine import Connection

from paretorch.pipeline.core.errors import PipelineError
from paretorch.pipeline.core.locks import file_lock
from paretorch.pipeline.core.paths import JOURNAL_PREFIX, local_path
from paretorch.pipeline.core.processes import process_exists
from paretorch.pipeline.core.secrets import mask_secrets
from paretorch.pipeline.core.writable import check_writable_dir
from paretorch.pipeline.engine.recipe import configs_from_json
from paretorch.pipeline.engine.short_recipe import short_recipe
from paretorch.pipeline.search.objectives import ATTR_CONFIGS, ATTR_RUNTIME, ATTR_SEED
from paretorch.pipeline.sources.archive import one_line

#: Seconds between a running trial's heartbeats, and how old the last one may be before the trial counts as dead.
HEARTBEAT_S = 5
GRACE_S = 15
#: User attribute: ``host:pid`` of the process that runs the trial.
ATTR_WORKER = "paretorch.worker"
SQLITE_TIMEOUT_S = 60
#: User attribute of a retry: why its configuration runs again (the trial before it was interrupted, or its process
#: died), one of :data:`INTERRUPTED` and :data:`DIED`.
ATTR_RERUN = "paretorch.rerun"
INTERRUPTED = "it was interrupted (Ctrl-C)"
DIED = "its process died (left RUNNING)"


@runtime_checkable
class Heartbeats(Protocol):
    """The heartbeat methods of :class:`optuna.storages.RDBStorage` (its documented ``record_heartbeat`` and
    ``get_heartbeat_interval``), also on the cache Optuna puts in front of it: a study's storage is never the
    ``RDBStorage`` itself."""

    def record_heartbeat(self, trial_id: int) -> None: ...

    def get_heartbeat_interval(self) -> int | None: ...


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The Optuna storage for ``url`` (schema created once, under the study lock's file lock for local files)."""
    path = local_path(url)
    if path is not None:
        check_writable_dir(path.parent, "the Optuna storage's directory", "--storage or --results-dir")
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            raise PipelineError(f"the Optuna storage {path} is not readable and writable by this user: "
                                "fix its permissions or pass another --storage")
    try:
        if url.startswith(JOURNAL_PREFIX) and path is not None:
            return JournalStorage(JournalFileBackend(str(path)))
        with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if path is not None:
                with file_lock(path.with_name(path.name + ".lock")):  # schema creation is not safe to race
                    return _with_heartbeats(url, {"connect_args": {"timeout": SQLITE_TIMEOUT_S}})
            return _with_heartbeats(url, {"pool_pre_ping": True})
    except PipelineError:
        raise
    except Exception as exc:  # a bad URL, a missing driver or an unreachable database
        hint = ""
        if isinstance(exc, ImportError) or "DB access module" in str(exc):
            hint = " (PostgreSQL needs the driver: pip install 'paretorch[postgresql]')"
        elif "Connection refused" in str(exc) or "could not connect" in str(exc):
            hint = " (is the database server running and reachable at that host and port?)"
        raise PipelineError(mask_secrets(f"cannot open the Optuna storage {url}: {one_line(exc)}{hint}")) from exc


def _with_heartbeats(url: str, engine_kwargs: dict[str, object]) -> RDBStorage:
    """An RDB storage whose running trials beat every :data:`HEARTBEAT_S`; one silent for :data:`GRACE_S` is retried."""
    return RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                      heartbeat_stale_trial_callback=retry_callback())


# ------------------------------------------------------------------ the study lock


class StudyLock:
    """An exclusive lock per (storage, study), shared by every worker; acquire/release may be split."""

    def __init__(self, url: str, storage: optuna.storages.BaseStorage, study_name: str) -> None:
        self.url = url
        self.storage = storage
        self.study_name = study_name
        self._file: FileLock | bool | None = None
        self._connection: Connection | None = None

    def _key(self) -> int:
        digest = hashlib.sha256(self.study_name.encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    def acquire(self) -> None:
        if self.held:
            return
        path = local_path(self.url)
        if path is not None:
            lock = file_lock(path.with_name(f"{path.name}.{self.study_name}.lock"))
            lock.acquire()
            self._file = lock
        elif isinstance(self.storage, RDBStorage) and self.storage.engine.dialect.name == "postgresql":
            connection = self.storage.engine.connect()
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": self._key()})
            connection.commit()
            self._connection = connection
        else:
            self._file = False  # no shared lock for this storage: workers may overshoot by one trial each

    @property
    def held(self) -> bool:
        return self._file is not None or self._connection is not None

    def release(self) -> None:
        if isinstance(self._file, FileLock):
            self._file.release()
        if self._connection is not None:
            self._connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self._key()})
            self._connection.commit()
            self._connection.close()
        self._file = None
        self._connection = None

    def __enter__(self) -> StudyLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# ------------------------------------------------------------------ dead workers


class MarkedRetry(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a failed trial (its params and user attributes, its seed, enqueued once more), the retry
    marked with why it runs (:data:`ATTR_RERUN`)."""

    def __init__(self, why: str, max_retry: int | None) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            super().__init__(max_retry=max_retry)
        self.why = why

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        marked = copy.copy(trial)
        marked.user_attrs = {**trial.user_attrs, ATTR_RERUN: self.why}
        super().__call__(study, marked)


def retry_callback() -> MarkedRetry:
    """Enqueue a dead trial's params and user attributes (its seed) once more, at most once per config."""
    return MarkedRetry(DIED, max_retry=1)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _dead_here(trial: FrozenTrial) -> bool:
    """True if ``trial`` runs in a process of this host that no longer exists."""
    host, _, pid = str(trial.user_attrs.get(ATTR_WORKER, "")).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    return not process_exists(int(pid))


def fail_dead_trials(study: optuna.Study) -> list[int]:
    """Mark FAIL the RUNNING trials whose process died (stale heartbeat, or a dead pid on this host) and
    enqueue each one's config once more; returns their numbers. Call under the study lock."""
    failed: list[int] = []
    if _heartbeats(study._storage) is not None:
        before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        failed.extend(sorted(before - after))
    retry = retry_callback()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _dead_here(trial) and study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
            retry(study, study._storage.get_trial(trial._trial_id))
            failed.append(trial.number)
    return failed


@contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Record ``trial``'s heartbeat every :data:`HEARTBEAT_S` in a thread for the ``with`` block, where the storage
    keeps heartbeats: what ``Study.optimize`` does around its objective and ask-and-tell does not (Optuna issue
    #3293), so that :func:`fail_dead_trials` never fails a trial that is still running."""
    storage = _heartbeats(study._storage)
    interval = storage.get_heartbeat_interval() if storage is not None else None
    if storage is None or not interval:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            storage.record_heartbeat(trial._trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat of trial {trial.number}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _heartbeats(storage: optuna.storages.BaseStorage) -> Heartbeats | None:
    """``storage`` where it keeps heartbeats (an RDB storage opened with ``heartbeat_interval``), else None."""
    if isinstance(storage, Heartbeats) and storage.get_heartbeat_interval():
        return storage
    return None


def retry_trial(study: optuna.Study, number: int) -> None:
    """Trial ``number`` was interrupted (Ctrl-C): mark it FAIL if a second Ctrl-C left it RUNNING, and enqueue its
    config once more, however often it was interrupted before (seeds and params survive). Not counted: it is
    :func:`retried`."""
    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    if trial is None or trial.state not in (TrialState.RUNNING, TrialState.FAIL):
        return
    if trial.state == TrialState.RUNNING:
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        trial = study._storage.get_trial(trial._trial_id)
    MarkedRetry(INTERRUPTED, max_retry=None)(study, trial)


def retried(trials: list[FrozenTrial]) -> set[int]:
    """The trials whose config was enqueued again (interrupted, or their process died): not trials of the study,
    their config's next run is. Optuna's retry callback keeps each retry's history in the retry's system attributes:
    pass every trial of the study (the retry may still be WAITING)."""
    return {number for t in trials for number in t.system_attrs.get("retry_history", ())}


def rerun_lines(trials: Sequence[FrozenTrial]) -> list[str]:
    """One line per waiting retry among ``trials`` (the study's): the trial it runs again and why."""
    return [rerun_line(t) for t in trials if t.state == TrialState.WAITING and t.system_attrs.get("retry_history")]


def rerun_line(retry: FrozenTrial) -> str:
    """``resuming: trial N (<recipe>) is run again: <why>``, N the trial before ``retry`` (the last it retries)."""
    number = retry.system_attrs["retry_history"][-1]
    return f"resuming: trial {number} ({asked(retry)}) is run again: {retry.user_attrs.get(ATTR_RERUN, DIED)}"


def asked(trial: FrozenTrial) -> str:
    """The recipe a trial asked for, short (its seed's name where it recorded none: a study of an older version)."""
    attrs = trial.user_attrs
    if ATTR_CONFIGS in attrs and ATTR_RUNTIME in attrs:
        return short_recipe(configs_from_json(attrs[ATTR_CONFIGS]).values(), str(attrs[ATTR_RUNTIME]))
    return str(attrs.get(ATTR_SEED) or "its sampled parameters")
