"""Third-party messages made fit for a table cell, a trial line, a tag or a stored reason."""

from __future__ import annotations

import re

#: ANSI/VT100 escape sequences: CSI (colours, cursor moves: ``ESC [ ... m``), OSC (titles, links:
#: ``ESC ] ... BEL`` or ``ESC ] ... ESC \``) and the two-character escapes (``ESC c``, ``ESC 7``...).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]")


def plain(text: str) -> str:
    """``text`` without terminal escape sequences (a compiler's coloured error, a progress bar's cursor moves)."""
    return _ANSI.sub("", text) if "\x1b" in text or "\x9b" in text else text
