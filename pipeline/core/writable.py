"""Checks that a directory the project writes to can be created and written, with one error naming the cause."""

from __future__ import annotations

import os
from pathlib import Path

from paretorch.pipeline.core.errors import PipelineError


def check_writable_dir(path: Path, what: str, flag: str) -> Path:
    """Create ``path`` if needed and check that this user can write there; else one :class:`PipelineError`
    naming ``what`` (e.g. "the results directory"), the cause and ``flag`` (what to change)."""
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        where = "is a file" if blocker == path else f"lies under a file ({blocker})"
        raise PipelineError(f"{what} {path} {where}: remove the file or choose another directory with {flag}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except PermissionError as exc:
        raise PipelineError(f"cannot create {what} {path}: permission denied on {blocker}; "
                            f"fix the permissions or choose another directory with {flag}") from exc
    except OSError as exc:
        raise PipelineError(f"cannot create {what} {path}: {exc.strerror}; choose another directory with {flag}") \
            from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise PipelineError(f"{what} {path} is not writable by this user (permission denied): "
                            f"fix its permissions or choose another directory with {flag}")
    return path
