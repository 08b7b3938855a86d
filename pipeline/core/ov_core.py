"""The one OpenVINO ``Core`` of this process.

OpenVINO 2026.4's CPU plugin installs a signal stack (``sigaltstack``) on the thread that creates a ``Core``'s
plugin and puts the previous stack back when that ``Core`` is destroyed. Two ``Core`` objects destroyed in the
order they were made leave the thread on the first one's freed stack; the next signal handled there (Python
runs its SIGINT handler on the signal stack) ends the process with SIGSEGV instead of ``KeyboardInterrupt``:
Ctrl-C after a few OpenVINO trials crashed. One ``Core`` that lives as long as the process never restores a
freed stack (short-lived ones inside other libraries, e.g. NNCF's ``openvino.compile_model``, are made and
destroyed in turn, which is safe). It also loads the plugin once instead of per model.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import openvino


@cache
def shared_core() -> openvino.Core:
    """The process-wide ``openvino.Core`` (created on first use, never destroyed before exit)."""
    import openvino  # an optional runtime: importing this module must not need it

    return openvino.Core()
