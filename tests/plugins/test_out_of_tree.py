"""A plugin's own CI, outside this checkout: a plugin package built in a temporary folder (the toy stage and the toy
runtime, importing only ``paretorch.extend``), pip-installed offline, with its own ``tests/test_contract.py`` that
subclasses ``paretorch.testing.StageContract`` / ``RuntimeContract``, run by ``python -m pytest`` in that folder
(our ``tests/conftest.py`` is not on the way); a deliberately broken plugin fails the contract it breaks, by name;
and the MLX plugin's own contract tests (``plugins/mlx/tests``), run the same way from a copy of the package.

Each inner run reads this session's trained digits weights (copied into its results folder): it trains nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from torch import nn

REPO = Path(__file__).resolve().parents[2]
MLX_PLUGIN = REPO / "plugins" / "mlx"
#: The toy plugins' own contract tests: what a plugin author writes.
TOY_CONTRACT_TESTS = '''
from paretorch.testing import RuntimeContract, StageContract


class TestScaleBias(StageContract):
    stage_name = "toy.scale_bias"


class TestInferenceMode(RuntimeContract):
    runtime_name = "inference_mode"
'''
#: A plugin that breaks one check of each contract on purpose: a config that can change after a recipe recorded
#: it (not frozen), and a runtime whose outputs are not the model's.
BROKEN_PLUGIN = '''
from pydantic import ConfigDict

from paretorch.extend import Runtime, Stage, StageConfig


class MutableConfig(StageConfig):
    model_config = ConfigDict(frozen=False, extra="forbid")
    stage = "broken.mutable"

    @classmethod
    def suggest(cls, trial, ctx):
        return cls()


def apply(model, config, ctx):
    return model


class OffByOne(Runtime):
    name = "off_by_one"

    def available(self, device):
        return True

    def prepare(self, model, export, device):
        return lambda *inputs: model(*inputs) + 1


STAGE = Stage(MutableConfig, apply)
RUNTIME = OffByOne()
'''
BROKEN_PYPROJECT = '''
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "broken-paretorch-plugin"
version = "0.1.0"

[project.entry-points."paretorch.stages"]
"broken.mutable" = "broken_paretorch_plugin:STAGE"

[project.entry-points."paretorch.runtimes"]
off_by_one = "broken_paretorch_plugin:RUNTIME"
'''
BROKEN_CONTRACT_TESTS = '''
from paretorch.testing import RuntimeContract, StageContract


class TestMutable(StageContract):
    stage_name = "broken.mutable"


class TestOffByOne(RuntimeContract):
    runtime_name = "off_by_one"
'''
#: One outcome line of ``pytest -rA``: ``PASSED tests/test_contract.py::TestScaleBias::test_...`` (skips name the
#: line that skipped, not the test: they are not read).
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR) [^\s:]+::(\S+)", re.MULTILINE)

Installer = Callable[[Iterable[Path], Path], Path]


def _contract_tests(project: Path, text: str) -> Path:
    (project / "tests").mkdir(parents=True, exist_ok=True)
    (project / "tests" / "test_contract.py").write_text(text)
    return project


def _broken_plugin(folder: Path) -> Path:
    package = folder / "broken_plugin"
    (package / "broken_paretorch_plugin").mkdir(parents=True)
    (package / "broken_paretorch_plugin" / "__init__.py").write_text(BROKEN_PLUGIN)
    (package / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    return package


def run_contracts(project: Path, sites: list[Path], weights: Path) -> tuple[subprocess.CompletedProcess[str],
                                                                           dict[str, str]]:
    """``python -m pytest -rA tests`` in ``project`` with the plugin ``sites`` on the path, and each test's
    outcome by its id (``TestScaleBias::test_...``)."""
    results = project / "results"
    shutil.copytree(weights, results / "cache" / "weights")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, sites), str(REPO)]),
           "PARETORCH_RESULTS_DIR": str(results)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "tests"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=project)
    outcomes = {test: outcome for outcome, test in OUTCOME.findall(run.stdout)}
    return run, outcomes


@pytest.fixture
def weights(digits_model: nn.Module, results_dir: Path) -> Path:
    """This session's cached digits weights (``digits_model`` trained them)."""
    return results_dir / "cache" / "weights"


def test_a_plugin_package_passes_the_contracts_in_its_own_ci(toy_plugin_site: Path, weights: Path,
                                                             tmp_path: Path) -> None:
    project = _contract_tests(tmp_path / "toy_plugins", TOY_CONTRACT_TESTS)
    run, outcomes = run_contracts(project, [toy_plugin_site], weights)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert f"rootdir: {project}" in run.stdout, "the inner run is the plugin's own, outside this checkout"
    ran = {test.split("::")[0] for test in outcomes}
    assert ran == {"TestScaleBias", "TestInferenceMode"} and "FAILED" not in outcomes.values(), outcomes
    assert outcomes["TestScaleBias::test_apply_leaves_its_input_unchanged_and_resolves_to_its_type"] == "PASSED"
    assert outcomes["TestInferenceMode::test_every_runtime_here_runs_the_model_like_eager"] == "PASSED"


def test_a_broken_plugin_fails_the_contract_it_breaks(plugin_installer: Installer, weights: Path,
                                                      tmp_path: Path) -> None:
    site = plugin_installer([_broken_plugin(tmp_path)], tmp_path)
    project = _contract_tests(tmp_path / "broken_project", BROKEN_CONTRACT_TESTS)
    run, outcomes = run_contracts(project, [site], weights)
    failed = {test for test, outcome in outcomes.items() if outcome == "FAILED"}
    assert run.returncode == 1, (run.stdout + run.stderr)[-6000:]
    assert failed == {"TestMutable::test_stage_record_is_consistent",
                      "TestOffByOne::test_every_runtime_here_runs_the_model_like_eager"}, run.stdout[-6000:]
    assert "Tensor-likes are not close" in run.stdout, "the failure says what differs"
    assert outcomes["TestMutable::test_suggest_returns_none_or_a_valid_config"] == "PASSED"


def test_the_mlx_plugin_passes_its_own_contract_tests(plugin_installer: Installer, weights: Path,
                                                      tmp_path: Path) -> None:
    pytest.importorskip("mlx.core", reason="the MLX plugin installs where an MLX wheel exists (make setup)")
    site = plugin_installer([MLX_PLUGIN], tmp_path)
    run, outcomes = run_contracts(tmp_path / "src" / MLX_PLUGIN.name, [site], weights)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert outcomes["TestMLXRuntime::test_every_runtime_here_runs_the_model_like_eager"] == "PASSED"
    assert outcomes["TestMLXExport::test_apply_leaves_its_input_unchanged_and_resolves_to_its_type"] == "PASSED"
