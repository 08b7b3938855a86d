"""Core reads declarations, not built-in names (issue 45.3): no string literal under ``pipeline/`` is the name of a
shipped stage or runtime, or a runtime's short label, outside the shipped defaults.

The shipped defaults (ARCHITECTURE.md, "Shipped defaults"): ``pipeline/defaults/`` (search.yaml, the pipeline files),
``pipeline/core/names.py`` (the built-in runtimes' console order, the default runtime) and each built-in runtime's
own module, which may name what it declares (its name, short label, engine, export stage, libraries and the stages
it reproduces). Docstrings and comments are prose, not decisions: only code literals are read. :data:`ALLOWED`
holds what is left elsewhere, one reason per entry; an entry whose literal is gone fails too, so the list shrinks.
"""

from __future__ import annotations

import ast
import inspect
from importlib import metadata
from pathlib import Path

import pytest

from paretorch.pipeline.core.names import RUNTIME_ENTRY_POINT_GROUP
from paretorch.pipeline.core.runtimes.base import Runtime
from paretorch.pipeline.core.runtimes.registry import registered_runtimes
from paretorch.pipeline.core.stage import ENTRY_POINT_GROUP as STAGE_ENTRY_POINT_GROUP

REPO = Path(__file__).resolve().parents[1]
SCANNED = REPO / "pipeline"
#: Files that are shipped defaults as a whole.
DEFAULTS = ("pipeline/defaults/", "pipeline/core/names.py")

#: (file, literal) left outside the defaults, each with why.
ALLOWED: dict[tuple[str, str], str] = {
    ("pipeline/core/length_groups.py", "pack"):
        "PACK: the stage whose padding-free run length-grouped calls reproduce (Reproduces.stages, paretorch.extend)",
    ("pipeline/core/report.py", "compile"): "the report's row label of compile time, not the runtime",
    **{("pipeline/search/config.py", name): "LEGACY_DEFAULT_RUNTIMES: the list older study names hashed (migration)"
       for name in ("eager", "compile", "compile_dynamic", "compile_cudagraphs", "onnxruntime", "openvino")},
    ("pipeline/tracking/tracker.py", "onnxruntime"):
        "TRACKED_LIBRARIES: a distribution MLflow records, read without torch (not the runtime)",
}


def shipped_entry_points(group: str) -> set[str]:
    """The entry-point names the project's own distributions (paretorch, its plugins in this repository) declare."""
    return {ep.name for dist in metadata.distributions() if dist.metadata["Name"].startswith("paretorch")
            for ep in dist.entry_points if ep.group == group}


def shipped_runtimes() -> dict[str, Runtime]:
    return {name: runtime for name, runtime in registered_runtimes().items()
            if name in shipped_entry_points(RUNTIME_ENTRY_POINT_GROUP)}


def builtin_names() -> set[str]:
    """Every shipped stage and runtime name and each runtime's short label."""
    runtimes = shipped_runtimes()
    return (shipped_entry_points(STAGE_ENTRY_POINT_GROUP) | set(runtimes)
            | {runtime.short() for runtime in runtimes.values()})


def declared_in_own_module() -> dict[str, set[str]]:
    """Per built-in runtime module (relative path), the literals its declaration holds."""
    allowed: dict[str, set[str]] = {}
    for runtime in shipped_runtimes().values():
        path = Path(inspect.getfile(type(runtime))).resolve()
        if not path.is_relative_to(SCANNED.resolve()):
            continue
        export = {runtime.export.stage} if runtime.export is not None else set()
        allowed.setdefault(path.relative_to(REPO).as_posix(), set()).update(
            {runtime.name, runtime.short_label, runtime.engine, *runtime.libraries, *export,
             *(runtime.reproduces.stages or ())})
    return allowed


def code_literals(path: Path) -> set[str]:
    """The string constants of ``path``'s code: docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


def found_names() -> set[tuple[str, str]]:
    """(file, literal) for each built-in name a scanned file's code holds, outside the shipped defaults."""
    names, own = builtin_names(), declared_in_own_module()
    found = set()
    for path in sorted(SCANNED.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(DEFAULTS):
            continue
        found |= {(relative, literal) for literal in code_literals(path) & names
                  if literal not in own.get(relative, set())}
    return found


def test_the_scan_knows_every_shipped_name() -> None:
    names = builtin_names()
    for expected in ("prune", "distill", "quantize", "amp", "pack", "export.onnx", "export.openvino", "eager",
                     "compile", "compile_dynamic", "compile_cudagraphs", "onnxruntime", "openvino", "ort", "ov",
                     "cudagraphs", "compile-dyn"):
        assert expected in names, expected


def test_the_scan_sees_a_name_in_code_and_not_in_a_docstring(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text('"""Runs under "eager"."""\n\n\ndef f(runtime="eager"):\n    """"onnxruntime" too."""\n'
                      '    return runtime == "openvino"\n')
    assert code_literals(module) == {"eager", "openvino"}


def test_no_builtin_name_is_left_in_pipeline_outside_the_defaults() -> None:
    unexplained = sorted(found_names() - set(ALLOWED))
    assert not unexplained, ("a built-in stage or runtime name in pipeline/ code: read a declaration (Stage, "
                             f"Runtime) or the shipped defaults (pipeline/core/names.py) instead: {unexplained}")


@pytest.mark.parametrize(("path", "literal"), sorted(ALLOWED))
def test_each_allowed_name_is_still_there(path: str, literal: str) -> None:
    assert (path, literal) in found_names(), f"{path} no longer holds {literal!r}: remove it from ALLOWED"
