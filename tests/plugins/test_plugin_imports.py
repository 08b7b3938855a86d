"""Plugins import paretorch through its plugin surface alone: ``paretorch.extend`` (what a stage or runtime is
built on) and ``paretorch.testing`` (the contract tests), never an internal module, so that the project can move
its internals without breaking a plugin. Checked over every plugin source here: ``plugins/`` (the MLX plugin, its
tests included) and the toy plugins the suite installs; and ``import paretorch.extend`` stays cheap (torch, never a
converter, a runtime toolkit or MLflow)."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from inspect import isfunction
from pathlib import Path

import pytest

import paretorch.extend as kit
from paretorch.pipeline.core import stage as stage_module
from paretorch.pipeline.core.runtimes import base as runtime_base

REPO = Path(__file__).resolve().parents[2]
PLUGIN_SOURCES = (REPO / "plugins", REPO / "tests" / "plugins" / "toy_runtime",
                  REPO / "tests" / "stages" / "toy_plugin")
#: The modules of paretorch a plugin may import.
PLUGIN_SURFACE = ("paretorch.extend", "paretorch.testing")
#: What ``import paretorch.extend`` must not load: the converters, the runtime toolkits, MLflow, Optuna's UI.
HEAVY = ("onnx", "onnxruntime", "coremltools", "openvino", "nncf", "mlflow", "torchao", "transformers",
         "matplotlib", "plotly", "optuna_dashboard", "sklearn")


def internal_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each import in ``path`` of paretorch (or a module of it) outside :data:`PLUGIN_SURFACE`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "paretorch":  # from paretorch import extend: the names are modules of it
                modules = [f"paretorch.{alias.name}" for alias in node.names]
        else:
            continue
        found.extend((node.lineno, module) for module in modules if _internal(module))
    return found


def _internal(module: str) -> bool:
    if module != "paretorch" and not module.startswith("paretorch."):
        return False
    return not any(module == allowed or module.startswith(allowed + ".") for allowed in PLUGIN_SURFACE)


def test_plugins_import_only_the_plugin_surface() -> None:
    paths = sorted(path for source in PLUGIN_SOURCES for path in source.rglob("*.py"))
    assert any(path.parts[-2] == "paretorch_mlx" for path in paths) and len(paths) > 5, "the plugins were found"
    offenders = [f"{path.relative_to(REPO)}:{line}: {module}"
                 for path in paths for line, module in internal_imports(path)]
    assert not offenders, ("plugins import paretorch.extend (or paretorch.testing in tests), never an internal "
                           "module (add the name to paretorch.extend):\n" + "\n".join(offenders))


@pytest.mark.parametrize(("source", "expected"), [
    ("from paretorch.pipeline.core.stage import Stage\n", [(1, "paretorch.pipeline.core.stage")]),
    ("import paretorch.stages.export.atomic as atomic\n", [(1, "paretorch.stages.export.atomic")]),
    ("from paretorch import api, extend\n", [(1, "paretorch.api")]),
    ("import paretorch\n", [(1, "paretorch")]),
    ("from paretorch.extend import Stage\nfrom paretorch.testing import StageContract\nimport paretorch_mlx\n", []),
    ("from .lower import lower\nimport torch\n", []),
])
def test_the_import_check_finds_an_internal_import(tmp_path: Path, source: str,
                                                   expected: list[tuple[int, str]]) -> None:
    sample = tmp_path / "plugin.py"
    sample.write_text(source)
    assert internal_imports(sample) == expected


#: Run in a fresh interpreter, the heavy libraries' names as its arguments.
IMPORT_THE_KIT = """
import json, sys
import paretorch.extend as kit
print(json.dumps({"loaded": sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[1:]),
                  "missing": [name for name in kit.__all__ if not hasattr(kit, name)]}))
"""


def test_importing_the_extension_kit_loads_no_heavy_library() -> None:
    run = subprocess.run([sys.executable, "-c", IMPORT_THE_KIT, *HEAVY], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.splitlines()[-1])
    assert report == {"loaded": [], "missing": []}, report


def test_the_kit_hands_out_the_projects_own_objects() -> None:
    """Each class and function of ``paretorch.extend`` is the object its own module defines (no copy, no wrapper):
    ``isinstance`` and the registries see one class."""
    defined = [value for value in map(kit.__dict__.get, kit.__all__) if isinstance(value, type) or isfunction(value)]
    assert len(defined) > 40
    for value in defined:
        assert value.__module__.startswith("paretorch.") and value.__module__ != kit.__name__, value
        assert getattr(importlib.import_module(value.__module__), value.__qualname__) is value
    assert kit.Stage is stage_module.Stage and kit.Runtime is runtime_base.Runtime
