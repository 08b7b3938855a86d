"""One import root (issue 45.1): everything paretorch installs is under ``paretorch.*``, so a user's own
``pipeline.py``, ``pipeline/``, ``stages/`` or ``experiments/`` beside their script or in the working directory is
never imported in place of ours, and stays theirs to import: for the installed ``paretorch`` command, for
``python -m paretorch``, for a script's ``import paretorch`` and for the wheel the project builds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from torch import nn

from paretorch.pipeline.core.evaluate import count_params

#: The user's own modules, each named like one of the repository's folders; importing one says whose it is.
SHADOWS = ("pipeline.py", "experiments/__init__.py", "stages/__init__.py")
REPO = Path(__file__).resolve().parents[3]


def _shadowed(folder: Path) -> Path:
    for path in SHADOWS:
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(f"OWNER = 'the user: {path}'\n")
    return folder


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PARETORCH_RESULTS_DIR": str(tmp_path / "runs")}
    env.pop("PYTHONPATH", None)
    return env


def _no_study_reported(run: subprocess.CompletedProcess[str]) -> None:
    # MODEL=digits resolved through its entry point (paretorch.experiments.models.digits), then the study looked up
    output = run.stdout + run.stderr
    assert run.returncode == 2 and "error: no study 'digits-" in output, output[-2000:]


def test_the_paretorch_command_ignores_the_users_folders(tmp_path: Path) -> None:
    command = shutil.which("paretorch", path=str(Path(sys.executable).parent))
    if command is None:
        pytest.skip("the paretorch console script is not installed in this environment (make setup installs it)")
    run = subprocess.run([command, "report", "--model", "digits"], cwd=_shadowed(tmp_path / "work"),
                         env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    _no_study_reported(run)


def test_python_dash_m_paretorch_ignores_the_users_folders(tmp_path: Path) -> None:
    """``python -m`` puts the working directory first on sys.path, where the user's ``pipeline.py`` is."""
    cwd, env = _shadowed(tmp_path / "work"), _env(tmp_path)
    helped = subprocess.run([sys.executable, "-m", "paretorch", "--help"], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=120)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: paretorch "), helped.stdout + helped.stderr
    version = subprocess.run([sys.executable, "-m", "paretorch", "--version"], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.strip().startswith("paretorch 0."), version.stdout
    _no_study_reported(subprocess.run([sys.executable, "-m", "paretorch", "report", "--model", "digits"], cwd=cwd,
                                      env=env, capture_output=True, text=True, timeout=300))


SCRIPT = """
import json, sys
import paretorch
bare = 'torch' in sys.modules
digits = paretorch.resolve_spec('digits')
ctx = paretorch.StageContext(spec=digits, device='cpu')
pruned = paretorch.apply_stage(paretorch.load_model(digits), paretorch.PruneConfig(ratio=0.3), ctx)
ours = {name: name in sys.modules for name in ('pipeline', 'stages', 'experiments')}
import paretorch.experiments, experiments, pipeline, stages
print(json.dumps({'bare_import_loaded_torch': bare, 'before': ctx.records['prune.params_before'],
                  'after': ctx.records['prune.params_after'], 'imported_by_paretorch': ours,
                  'users': [pipeline.OWNER, experiments.OWNER, stages.OWNER],
                  'prune_from': sys.modules[type(ctx).__module__].__file__}))
"""


def test_a_script_beside_the_users_folders_runs_our_stages_and_keeps_its_own_modules(
        tmp_path: Path, pristine_digits_model: nn.Module) -> None:
    """The script's folder is first on sys.path; the script still prunes the project's digits model (trained once by
    the fixture: the subprocess reads it from the same results folder's weight cache), and its own ``pipeline``,
    ``stages`` and ``experiments`` are the user's."""
    folder = _shadowed(tmp_path / "work")
    (folder / "script.py").write_text(SCRIPT)
    env = {**_env(tmp_path), "PARETORCH_RESULTS_DIR": os.environ["PARETORCH_RESULTS_DIR"]}
    run = subprocess.run([sys.executable, "script.py"], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    shown = json.loads(run.stdout.strip().splitlines()[-1])
    assert shown["imported_by_paretorch"] == {"pipeline": False, "stages": False, "experiments": False}
    assert shown["users"] == [f"the user: {path}" for path in SHADOWS]
    assert Path(shown["prune_from"]).resolve().is_relative_to(REPO)
    assert shown["bare_import_loaded_torch"] is False  # the names load on first use
    assert shown["before"] == count_params(pristine_digits_model) and shown["after"] < shown["before"]


def test_the_wheel_installs_paretorch_alone(tmp_path: Path) -> None:
    """The wheel built from this tree (setuptools, no network) holds one top-level package, with the repository's
    ``pipeline/``, ``stages/`` and ``experiments/`` inside it and their package data."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("paretorch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"paretorch", wheel.name.split("-py")[0] + ".dist-info"}
    for module in ("paretorch/pipeline/cli/main.py", "paretorch/stages/prune/stage.py",
                   "paretorch/experiments/models/digits.py", "paretorch/pipeline/defaults/search.yaml",
                   "paretorch/experiments/data/minilm_sentences.txt"):
        assert module in names, module
    points = zipfile.ZipFile(wheel).read(wheel.name.split("-py")[0] + ".dist-info/entry_points.txt").decode()
    targets = [line.split("=", 1)[1].strip() for line in points.splitlines() if "=" in line]
    assert targets and all(target.startswith("paretorch.") for target in targets), targets
