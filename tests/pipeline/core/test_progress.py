"""No silent minutes: one start and one end line per long phase in a log, a live bar on a terminal;
third-party escape codes stripped from what is recorded."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console
from rich.progress import Progress

from paretorch.pipeline.core.progress import phase, progress_columns, sharing
from paretorch.pipeline.core.text import plain


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_phase_in_a_log_is_one_start_and_one_end_line() -> None:
    log = io.StringIO()
    with phase("digits: training the model once (3 epochs)", total=3, stream=log, after=0) as shown:
        for _ in range(3):
            shown.advance()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0] == "digits: training the model once (3 epochs) ..."
    assert lines[1].startswith("digits: training the model once (3 epochs): done in ") and lines[1].endswith(" s")


def test_a_short_phase_leaves_no_line_and_a_long_one_shows_its_start_once_it_is_long() -> None:
    log = io.StringIO()
    with phase("quick", stream=log):
        pass
    assert log.getvalue() == ""
    with phase("slow", stream=log, after=0.05):
        time.sleep(0.3)  # the start line comes from a timer thread once the phase has run 0.05 s
    assert [line.split(":")[0] for line in log.getvalue().splitlines()] == ["slow ...", "slow"]


def test_a_failing_phase_says_so() -> None:
    log = io.StringIO()
    with pytest.raises(RuntimeError), phase("calibration", stream=log, after=0):
        raise RuntimeError("boom")
    assert log.getvalue().splitlines()[1].startswith("calibration: failed after ")


def test_on_a_terminal_phases_nest_in_one_live_display() -> None:
    screen = Terminal()
    with phase("outer", total=2, stream=screen, after=0) as outer, phase("inner", after=0):
        outer.advance()  # a second rich live display would raise LiveError
    assert "inner: done in" in screen.getvalue() and "outer: done in" in screen.getvalue()


def test_inside_a_search_a_phase_writes_to_the_searchs_console() -> None:
    log = io.StringIO()
    progress = Progress(*progress_columns(), console=Console(file=log, width=200))
    with sharing(progress), phase("distill: 400 steps", after=0):
        pass
    assert [line.split(":")[0] for line in log.getvalue().splitlines()] == ["distill", "distill"]


def test_escape_codes_are_stripped() -> None:
    coloured = "\x1b[1m\x1b[31merror:\x1b[0m no kernel for \x1b]8;;http://x\x07int4\x1b]8;;\x07 on cpu\x1b[K"
    assert plain(coloured) == "error: no kernel for int4 on cpu"
    assert plain("drop 0.034 > allowed 0.01") == "drop 0.034 > allowed 0.01"
