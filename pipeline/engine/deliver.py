"""Exported files where the user looks: copied out of the export cache into one folder.

The export cache (:class:`paretorch.pipeline.engine.cache.NodeCache`) keeps each export under its content key
(``<results>/cache/exports/<key>/``); a user deploys from a folder they named (``run_chain``'s
``output_dir``, ``pipeline apply --output``) or from the study folder of a Pareto trial
(``<results>/studies/<study>/trial-NNN/``, beside its ``recipe.json``). :func:`deliver` puts the
file there, with the files that belong to it (an ONNX model's external data ``model.onnx.data``).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from paretorch.pipeline.core.stage import ExportResult


def deliver(result: ExportResult, folder: Path) -> ExportResult:
    """Copy ``result``'s file or package directory (``.mlpackage``, an OpenVINO IR folder) and its companion files
    into ``folder`` (created; an older copy of the same name is replaced): the result with its path there."""
    folder.mkdir(parents=True, exist_ok=True)
    source = Path(result.path)
    target = folder / source.name
    if source.resolve() != target.resolve():
        copy_artifact(source, target)
    return dataclasses.replace(result, path=target)


def copy_artifact(source: Path, target: Path) -> None:
    """Copy a file or a package directory, with the files beside it that extend its name (``model.onnx.data``)."""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)
    for sibling in companions(source)[1:]:
        shutil.copy2(sibling, target.parent / sibling.name)


def companions(path: Path) -> list[Path]:
    """``path`` and the files beside it that extend its name (``model.onnx`` -> ``model.onnx.data``)."""
    return [path, *sorted(p for p in path.parent.glob(f"{path.name}.*") if p.is_file())]


def delivered(folder: Path, kept: tuple[str, ...] = ("recipe.json", "profile")) -> list[Path]:
    """The deployable files in a trial's folder: everything but ``kept`` (its recipe and profile) and hidden files."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name not in kept and not p.name.startswith("."))
