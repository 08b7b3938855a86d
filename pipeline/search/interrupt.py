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
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class Interrupts:
    """Whether SIGINT arrived while :meth:`watch` was active."""

    def __init__(self) -> None:
        self.requested = False

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Flag SIGINT for the ``with`` block; the previous handler still runs (and raises). A SIGINT that
        is ignored (a background job) stays ignored; outside the main thread nothing is installed."""
        self.requested = False
        previous: Any = signal.getsignal(signal.SIGINT)
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
    previous: Any = signal.getsignal(signal.SIGINT)
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
