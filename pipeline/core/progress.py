"""No silent minutes: one helper for every phase that may take more than a few seconds.

``with phase("digits: training the model once (40 epochs)", total=40) as step: ... step.advance()``

* on a terminal (standard output is a TTY): a live line with a bar (or a spinner when the total
  is unknown) and the elapsed time, then one end line with the seconds it took;
* otherwise (a log file, CI, a pipe): exactly one start line and one end line, nothing between;
* a phase over within :data:`SHOW_AFTER_S` leaves no line (a log of 20 trials is not 80 lines of
  "calibrating: done in 0.0 s"); a longer one shows its start line once it has run that long;
* inside a search's live trial bar (:func:`sharing`), or inside another phase on a terminal, the
  phase is one more row of the live display already on screen (rich allows one live display at a time).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

#: Phases over within this many seconds leave no line (they are not what a silent minute is made of).
SHOW_AFTER_S = 2.0
#: The live display phases join: a search's trial bar (:func:`sharing`) or the outermost phase's own.
_live: Progress | None = None


class Phase:
    """A running phase: :meth:`advance` moves its bar (a no-op in a log)."""

    def __init__(self, progress: Progress | None = None, task: TaskID | None = None) -> None:
        self._progress = progress
        self._task = task

    def advance(self, steps: float = 1.0, note: str | None = None) -> None:
        if self._progress is not None and self._task is not None:
            if note is None:
                self._progress.update(self._task, advance=steps)
            else:  # a task field the columns show (rich passes unknown keywords to the task's fields)
                self._progress.update(self._task, advance=steps, note=note)


def progress_columns(*extra: ProgressColumn | str) -> tuple[ProgressColumn | str, ...]:
    """The columns of a live phase display (a search adds its own fields after these)."""
    return (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[note]}"), *extra)


@contextlib.contextmanager
def sharing(progress: Progress) -> Iterator[Progress]:
    """Phases that start inside this block are rows of ``progress`` (a search's live trial bar);
    its tasks need a ``note`` field (``add_task(..., note="")``)."""
    global _live
    previous, _live = _live, progress
    try:
        yield progress
    finally:
        _live = previous


def say(console: Console, text: str) -> None:
    """Print one line of prose as written: a terminal wraps it between words (never inside one, at 80 columns
    too), a log file or pipe keeps it whole (one line, to grep)."""
    console.print(text, markup=False, highlight=False, soft_wrap=not console.is_terminal)


@contextlib.contextmanager
def phase(name: str, total: int | None = None, stream: TextIO | None = None,
          after: float | None = None) -> Iterator[Phase]:
    """Show ``name`` while the block runs (module docstring); the end line says how long it took, or
    that it failed. A phase over within ``after`` seconds (default :data:`SHOW_AFTER_S`) leaves no line.
    ``stream``: where to write (default: standard output, or the shared display's console)."""
    global _live
    after = SHOW_AFTER_S if after is None else after
    start = time.perf_counter()
    shared = _live if stream is None else None
    console = shared.console if shared is not None else Console(file=stream if stream is not None else sys.stdout)
    ending = ["failed after"]

    def end_line() -> str:
        return f"{name}: {ending[0]} {time.perf_counter() - start:.1f} s"

    if not console.is_terminal:
        with _LogLines(console, f"{name} ...", end_line, after):
            yield Phase()
            ending[0] = "done in"
        return
    progress = shared or Progress(*progress_columns(), console=console, transient=True, redirect_stderr=False)
    task = progress.add_task(name, total=total, note="", best="")
    previous, _live = _live, progress
    try:
        with contextlib.nullcontext() if shared is not None else progress:
            yield Phase(progress, task)
            ending[0] = "done in"
    finally:
        _live = previous
        progress.remove_task(task)
        if time.perf_counter() - start >= after:
            say(console, end_line())


class _LogLines:
    """The start line (once the phase has run ``after`` seconds: a timer thread) and then the end line
    (``end``, called when the block ends); both or neither."""

    def __init__(self, console: Console, start: str, end: Callable[[], str], after: float) -> None:
        self.console, self.start, self.end, self.after = console, start, end, after
        self._lock = threading.Lock()
        self._said = self._over = False
        self._timer: threading.Timer | None = None

    def _start_line(self) -> None:
        with self._lock:
            if not self._over:
                say(self.console, self.start)
                self._said = True

    def __enter__(self) -> _LogLines:
        if self.after <= 0:
            self._start_line()
        else:
            self._timer = threading.Timer(self.after, self._start_line)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._over = True
            said = self._said
        if said:
            say(self.console, self.end())
