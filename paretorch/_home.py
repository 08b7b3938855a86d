"""The project's own ``pipeline``, ``stages`` and ``experiments``, from the folder that holds ``paretorch``.

Python puts the working directory (``python -c``, ``python -m``) or the script's folder first on ``sys.path``, so
a user's own ``pipeline.py``, ``stages/`` or ``experiments/`` there would be imported in place of the project's
packages. :func:`claim` imports the three from beside ``paretorch`` (where the wheel installs them, or the
repository an editable install points at) before anything else does; once they are in ``sys.modules``, every
submodule import (``pipeline.api``, the ``stages.prune.stage`` an entry point names) follows their ``__path__``.
"""

from __future__ import annotations

import sys
from importlib.machinery import PathFinder
from importlib.util import module_from_spec
from pathlib import Path
from types import ModuleType

#: The top-level packages the wheel installs beside ``paretorch``.
PACKAGES = ("pipeline", "stages", "experiments")
#: The folder that holds ``paretorch`` and, beside it, :data:`PACKAGES`.
HOME = Path(__file__).resolve().parent.parent


def claim(home: Path = HOME) -> None:
    """Import :data:`PACKAGES` from ``home``; one already imported from elsewhere is an ImportError."""
    for name in PACKAGES:
        module = sys.modules.get(name)
        if module is None:
            _import_from(name, home)
        elif not _inside(module, home / name):
            raise ImportError(
                f"paretorch: a module named '{name}' is already imported from {_origin(module)}, not the project's "
                f"({home / name}): import paretorch before it, or rename your own '{name}'")


def _import_from(name: str, home: Path) -> ModuleType:
    spec = PathFinder.find_spec(name, [str(home)])
    if spec is None or spec.loader is None:
        raise ImportError(f"paretorch: the project's '{name}' package is missing from {home}: reinstall paretorch")
    module = module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # as the import system does: a failed import leaves no half-made module
        raise
    return module


def _origin(module: ModuleType) -> str:
    return str(getattr(module, "__file__", None) or getattr(module, "__path__", None) or "an unknown place")


def _inside(module: ModuleType, folder: Path) -> bool:
    path = getattr(module, "__file__", None)
    return path is not None and Path(path).resolve().is_relative_to(folder.resolve())
