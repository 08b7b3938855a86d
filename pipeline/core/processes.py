"""Whether a process of this machine still exists (a dead worker's trial, a killed export's staging folder)."""

from __future__ import annotations

import os


def process_exists(pid: int) -> bool:
    """True while process ``pid`` exists on this machine (also when it belongs to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
