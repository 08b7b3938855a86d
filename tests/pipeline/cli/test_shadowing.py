"""A user's own folders and files named like the project's packages (``pipeline.py``, ``experiments/``,
``stages/``) in the working directory change nothing for the installed ``paretorch`` command (the one make and
the docs use), nor for the worker processes it starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.search.workers import worker_command

SHADOWS = {"pipeline.py": "pipeline.py", "experiments/__init__.py": "experiments/", "stages/__init__.py": "stages/"}


def _shadowed(folder: Path) -> Path:
    for path, what in SHADOWS.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(f"raise SystemExit('SHADOWED by the working directory: {what}')\n")
    return folder


def test_the_paretorch_command_ignores_shadowing_folders_in_the_working_directory(tmp_path: Path) -> None:
    command = shutil.which("paretorch", path=str(Path(sys.executable).parent))
    if command is None:
        pytest.skip("the paretorch console script is not installed in this environment (make setup installs it)")
    cwd = _shadowed(tmp_path / "work")
    env = {**os.environ, "PARETORCH_RESULTS_DIR": str(tmp_path / "runs")}
    env.pop("PYTHONPATH", None)
    run = subprocess.run([command, "report", "--model", "digits"], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=300)
    output = run.stdout + run.stderr
    assert "SHADOWED" not in output
    # MODEL=digits resolved through its entry point (experiments.models.digits), then the study is looked up:
    assert run.returncode == 2 and "error: no study 'digits-" in output, output[-2000:]


def test_python_dash_m_would_be_shadowed_so_workers_start_with_dash_p(tmp_path: Path) -> None:
    """What the command avoids: ``python -m pipeline`` in that folder imports the user's file; the workers of a
    search start with ``-P`` (no working directory on sys.path)."""
    cwd = _shadowed(tmp_path / "work")
    plain = subprocess.run([sys.executable, "-m", "pipeline", "--help"], cwd=cwd, capture_output=True, text=True,
                           timeout=120)
    assert "SHADOWED by the working directory: pipeline.py" in plain.stdout + plain.stderr
    interpreter = worker_command([], 0)[:4]  # python -P -m pipeline
    guarded = subprocess.run([*interpreter, "--help"], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert guarded.returncode == 0 and "SHADOWED" not in guarded.stdout + guarded.stderr
