"""A table that fits a narrow terminal by wrapping its cells between words, never inside one.

rich alone narrows every wrapping column alike when a table is too wide and then folds or cuts words
(``prun… + dist…``). :class:`WordTable` narrows the widest columns first and none below its longest word,
decided when it is printed (the console's width is known only then); the layout is compact (no vertical
rules, two spaces between columns) so that more fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Column, Table
from rich.text import Text

#: Characters between two columns: one of padding and the (blank) rule.
GAP = 2


class WordTable(Table):
    """A rich :class:`~rich.table.Table` whose columns wrap between words at any console width where each
    column's longest word fits (see the module docstring)."""

    def __init__(self, *headers: Column | str, **kwargs: Any) -> None:
        layout = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False, "padding": (0, 1),
                  "collapse_padding": True}
        super().__init__(*headers, **{**layout, **kwargs})

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        room = options.max_width - GAP * (len(self.columns) - 1)
        widths = fit_widths([_texts(column) for column in self.columns], room)
        for column, width in zip(self.columns, widths, strict=True):
            column.width = width
        yield from super().__rich_console__(console, options)


def _texts(column: Column) -> list[str]:
    cells = [column.header, *column.cells]
    return [cell.plain if isinstance(cell, Text) else str(cell) for cell in cells]


def fit_widths(columns: Sequence[Sequence[str]], room: int) -> list[int | None]:
    """Content widths for ``columns`` (each its header, then its cells) within ``room`` characters: None for each
    (their natural widths) when they fit. Else headers wrap first (each column narrowed toward its widest cell),
    then cells; the widest column is narrowed first, one character at a time, none below its longest word (the
    sum may then exceed ``room``: no width fits without cutting a word)."""
    natural = [_widest(texts, str.splitlines) for texts in columns]
    if sum(natural) <= room:
        return [None] * len(columns)
    floor = [_widest(texts, str.split) for texts in columns]
    widths = list(natural)
    for limits in ([max(_widest(texts[1:], str.splitlines), low) for texts, low in zip(columns, floor, strict=True)],
                   floor):
        excess = sum(widths) - room
        while excess > 0:
            narrowable = [i for i, width in enumerate(widths) if width > limits[i]]
            if not narrowable:
                break
            widest = max(narrowable, key=lambda i: widths[i])
            widths[widest] -= 1
            excess -= 1
    return list(widths)


def _widest(texts: Sequence[str], parts: Callable[[str], list[str]]) -> int:
    """The widest of the ``parts`` (lines, or words) of ``texts``."""
    return max((cell_len(part) for text in texts for part in parts(text)), default=0)
