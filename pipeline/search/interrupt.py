"""Ctrl-C always stops a trial, even where third-party code swallows it.

Some libraries catch broad exceptions around the code they run: torch-pruning's dependency
graph traces the model inside ``except Exception``-style handlers, so a ``KeyboardInterrupt``
raised while it traces can come back as a ``TypeError`` (wrapped by the prune stage into an
infeasibility), or not at all. :class:`Interrupts` installs, for the length of a trial, a
SIGINT handler that first sets a flag and then does what the previous handler did (Python's
default raises ``KeyboardInterrupt``). The trial objective asks :meth:`Interrupts.check` after
any exception and after every step: once SIGINT arrived, whatever happened afterwards is the
interrupt, never a trial's outcome.
"""

from __future__ import annotations

import signal
import threading
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
