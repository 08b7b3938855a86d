"""An exclusive file lock between processes of one machine (creating a store's schema, a study, a run):
:class:`filelock.FileLock` (an ``flock`` on POSIX, ``LockFileEx`` on Windows)."""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock


def file_lock(path: Path) -> FileLock:
    """An exclusive lock on ``path`` (created if missing, its folder too): ``with file_lock(p): ...``, or
    ``acquire()`` and ``release()`` where the two happen apart (a study's lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path)
