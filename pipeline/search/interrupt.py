"""Ctrl-C always stops a trial, even where third-party code swallows it.

Some libraries catch broad exceptions around the code they run: torch-pruning's dependency
graph traces the model inside ``except Exception``-style handlers, so a ``KeyboardInterrupt``
raised while it traces can come back as a ``TypeError`` (wrapped by the prune stage into an
infeasibility), or not at all. :class:`Interrupts` installs, for the length of a trial, a
SIGINT handler that first sets a flag and then does what the previous handler did (Python's
default raises ``KeyboardInterrupt``). The trial objective asks :meth:`Interrupts.check` after
any exception and after every step: once SIGINT arrived, whatever happened afterwards is the
interrupt, never a trial's outcome.

A search runs under :func:`stopping`: a second Ctrl-C right after the first prints one line and waits
for the few writes that record what is done, so it never leaves a trial or a run RUNNING.

Every place that catches the interrupt to record what is done first lets go of what the interrupted code held
(:func:`release`, :func:`releasing`): a SIGINT that lands inside a SQLite write (the Optuna storage's, MLflow's) is
raised after the statement ran, and SQLAlchemy gives up the connection without rolling it back, so the write
transaction and the database's lock stay open for as long as the traceback's frames keep the connection alive. The
next write (the trial marked FAIL, the heartbeat thread) then waits out the storage's 60 s busy timeout (the first
Ctrl-C of one search took 64.4 s to exit; an interrupt injected inside a trial's attribute write, 60 s and more).
Cleared, the lock goes with the connection, and the exit takes about a second.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Interrupts:
    """Whether SIGINT arrived while :meth:`watch` was active."""

    def __init__(self) -> None:
        self.requested = False

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Flag SIGINT for the ``with`` block; the previous handler still runs (and raises). A SIGINT that
        is ignored (a background job) stays ignored; outside the main thread nothing is installed."""
        self.requested = False
        previous = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is not threading.main_thread() or not callable(previous):
            yield
            return

        def flag(signum: int, frame: FrameType | None) -> None:
            self.requested = True
            previous(signum, frame)

        signal.signal(signal.SIGINT, flag)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def check(self, cause: BaseException | None = None) -> None:
        """Raise ``KeyboardInterrupt`` (from ``cause``, the exception SIGINT turned into) if SIGINT arrived."""
        if self.requested:
            raise KeyboardInterrupt from cause


def release(exc: BaseException) -> None:
    """Clear the locals of the frames that ``exc`` and the exceptions it came from (its cause and context) ran
    through, so what they held goes now (an open SQLite transaction, its lock), not when the traceback is collected.
    The frames still running (the caller's) are left as they are."""
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)


@contextmanager
def releasing() -> Iterator[None]:
    """For the ``with`` block: a ``KeyboardInterrupt`` out of it is released (:func:`release`), then raised again."""
    try:
        yield
    except KeyboardInterrupt as exc:
        release(exc)
        raise


#: Seconds after a Ctrl-C during which another one is held off, while what is done is recorded.
GRACE_S = 5.0
#: What a Ctrl-C within :data:`GRACE_S` of the first prints (once).
HELD_NOTE = "interrupted again: recording what is done first (a second or so)"


@contextmanager
def stopping(grace: float = GRACE_S) -> Iterator[None]:
    """For the ``with`` block (a search): the first Ctrl-C raises ``KeyboardInterrupt`` as Python's default does; one
    within ``grace`` seconds of it prints :data:`HELD_NOTE` once and is otherwise ignored, so the few writes that
    record what is done (the interrupted trial FAIL and enqueued again, the MLflow parent run closed) are never cut
    short; a Ctrl-C after that raises again. An ignored SIGINT (a background job) stays ignored; outside the main
    thread nothing is installed."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is not signal.default_int_handler:
        yield
        return
    first: list[float] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if first and now - first[0] < grace:
            if len(first) == 1:
                print(HELD_NOTE, file=sys.stdout, flush=True)  # the console: standard error may go to a log
            first.append(now)
            return
        first[:] = [now]
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
