"""WordTable: a narrow console wraps cells between words, never inside one."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from paretorch.pipeline.core.word_table import WordTable, fit_widths


def rendered(table: WordTable, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, record=True)
    console.print(table)
    return console.export_text()


def test_columns_that_fit_keep_their_natural_widths() -> None:
    assert fit_widths([["a", "bb"], ["ccc"]], room=10) == [None, None]


def test_headers_wrap_before_cells_and_no_column_goes_below_its_longest_word() -> None:
    columns = [["speed-up [95% CI] ~ tied with", "5.08x [4.73, 5.18]"], ["recipe", "prune 0.3 + distill 200 + int8s"]]
    # the header narrows to its cell's width (29 -> 18) before the recipe (31 -> 22) wraps
    assert fit_widths(columns, room=40) == [len("5.08x [4.73, 5.18]"), 22]
    assert fit_widths(columns, room=5) == [len("speed-up"), len("distill")], "never below the longest word"


@pytest.mark.parametrize("width", [40, 60, 80])
def test_a_narrow_console_cuts_no_word(width: int) -> None:
    table = WordTable(title="short title")
    for header in ("trial", "speed-up [95% CI]", "recipe", "exports"):
        table.add_column(header)
    cells = ("16", "5.08x [4.73, 5.18] ~ 3, 21", "prune 0.3 + distill 200 + int8s | ort", "onnx, no coreml")
    table.add_row(*cells)
    text = rendered(table, width)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    words = text.split()
    assert all(word in words for cell in cells for word in cell.split()), text
