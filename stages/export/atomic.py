"""Atomic artifacts: an export is complete and validated, or it is not there at all."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from paretorch.pipeline.core.errors import PipelineError

STAGING_SUFFIX = ".partial"


@contextmanager
def atomic_artifact(output_dir: Path, name: str) -> Iterator[Path]:
    """Yield a path inside a fresh staging directory of ``output_dir``; when the
    block ends without an exception, move what was written there to
    ``output_dir / name`` (replacing an older artifact of that name).

    On any exception the staging directory is deleted and an older artifact is
    left as it was, so a failed export never leaves a partial file behind. The
    artifact may be a file (``.onnx``, ``.pt2``) or a directory (``.mlpackage``).
    """
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=STAGING_SUFFIX, dir=output_dir))
    try:
        staged = staging / name
        yield staged
        if not staged.exists():
            raise PipelineError(f"the exporter wrote nothing at {staged}")
        _move_into_place(staged, output_dir / name, staging)
    finally:
        # Only our own temporary files live here; a failure to delete them must
        # not hide the exception that ended the export.
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(staged: Path, final: Path, staging: Path) -> None:
    """Rename ``staged`` to ``final``. A file replaces a file in one ``os.replace``;
    an existing directory is first renamed aside (into ``staging``, deleted later)."""
    if final.is_dir() and not final.is_symlink():
        os.replace(final, staging / f"previous-{final.name}")
    elif final.exists() and staged.is_dir():
        final.unlink()
    os.replace(staged, final)


def artifact_size_bytes(path: Path) -> int:
    """Bytes of a file, or of all files under a directory (an ``.mlpackage``)."""
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size
