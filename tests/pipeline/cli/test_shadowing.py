"""A user's own folders and files named like the project's packages (``pipeline.py``, ``experiments/``,
``stages/``) in the working directory change nothing for the installed ``paretorch`` command (the one make and
the docs use), nor for the worker processes it starts, nor for ``python -m paretorch`` and a script's
``import paretorch`` (issue 34.7)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

from paretorch._home import HOME
from pipeline.core.evaluate import count_params
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


def _with_paretorch() -> dict[str, str]:
    """This environment, with the folder that holds the tested ``paretorch`` on PYTHONPATH (after the working
    directory, which ``python -c`` and ``python -m`` put first)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(HOME), os.environ.get("PYTHONPATH")) if p)}


SCRIPT = """
import json, sys
import paretorch
bare = 'torch' in sys.modules
digits = paretorch.resolve_spec('digits')
ctx = paretorch.StageContext(spec=digits, device='cpu')
pruned = paretorch.apply_stage(paretorch.load_model(digits), paretorch.PruneConfig(ratio=0.3), ctx)
print(json.dumps({'bare_import_loaded_torch': bare, 'before': ctx.records['prune.params_before'],
                  'after': ctx.records['prune.params_after'],
                  'files': {name: sys.modules[name].__file__ for name in ('pipeline', 'stages', 'experiments')}}))
"""


def test_import_paretorch_runs_the_projects_stages_in_a_shadowing_folder(tmp_path: Path,
                                                                          pristine_digits_model: nn.Module) -> None:
    """``python -c`` puts the working directory first on sys.path; the script still prunes the project's digits
    model (trained once by the fixture: the subprocess reads it from the same results folder's weight cache)."""
    cwd = _shadowed(tmp_path / "work")
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=cwd, env=_with_paretorch(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "SHADOWED" not in run.stdout + run.stderr, run.stderr[-3000:]
    shown = json.loads(run.stdout.strip().splitlines()[-1])
    assert shown["files"] == {name: str(HOME / name / "__init__.py") for name in ("pipeline", "stages", "experiments")}
    assert shown["bare_import_loaded_torch"] is False  # the names load on first use
    assert shown["before"] == count_params(pristine_digits_model) and shown["after"] < shown["before"]


def test_python_dash_m_paretorch_is_the_command_in_a_shadowing_folder(tmp_path: Path) -> None:
    cwd = _shadowed(tmp_path / "work")
    env = {**_with_paretorch(), "PARETORCH_RESULTS_DIR": str(tmp_path / "runs")}
    helped = subprocess.run([sys.executable, "-m", "paretorch", "--help"], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=120)
    assert helped.returncode == 0 and "optimize" in helped.stdout, helped.stdout + helped.stderr
    report = subprocess.run([sys.executable, "-m", "paretorch", "report", "--model", "digits"], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300)
    output = report.stdout + report.stderr
    assert "SHADOWED" not in helped.stdout + helped.stderr + output
    # as the console command: MODEL=digits resolved through its entry point, then the study is looked up
    assert report.returncode == 2 and "error: no study 'digits-" in output, output[-2000:]
