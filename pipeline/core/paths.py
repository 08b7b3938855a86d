"""Where the project writes: one results directory for everything."""

from __future__ import annotations

import os
from pathlib import Path

from paretorch.pipeline.core.writable import check_writable_dir

DEFAULT_RESULTS_DIR = "runs"
RESULTS_ENV_VAR = "PARETORCH_RESULTS_DIR"
RESULTS_FLAG = "--results-dir (make: RESULTS=)"


def results_dir() -> Path:
    """The results directory (``--results-dir`` / ``RESULTS=``; default ``runs/``)."""
    # An empty variable (``PARETORCH_RESULTS_DIR=``) means unset, never the current directory.
    path = Path(os.environ.get(RESULTS_ENV_VAR) or DEFAULT_RESULTS_DIR).expanduser().absolute()
    return check_writable_dir(path, "the results directory", RESULTS_FLAG).resolve()


def set_results_dir(path: str | os.PathLike[str]) -> Path:
    """Point every later :func:`results_dir` call (and child processes) at ``path``."""
    target = Path(path).expanduser().absolute()
    check_writable_dir(target, "the results directory", RESULTS_FLAG)  # before anything points there
    os.environ[RESULTS_ENV_VAR] = str(target.resolve())
    return results_dir()


def cache_dir(kind: str) -> Path:
    """A sub-directory of the results directory for one kind of cached file."""
    return check_writable_dir(results_dir() / "cache" / kind, f"the cache directory ({kind})", "--results-dir")


#: The shipped configs (``pipeline/defaults``, package data): search defaults and pipeline files.
CONFIGS_DIR = Path(__file__).resolve().parents[1] / "defaults"
#: The search defaults (``pipeline/defaults/search.yaml``).
DEFAULT_SEARCH_CONFIG = CONFIGS_DIR / "search.yaml"
#: Where ``--pipeline NAME`` finds ``NAME.yaml``.
PIPELINES_DIR = CONFIGS_DIR / "pipelines"


SQLITE_PREFIX = "sqlite:///"


def sqlite_file(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL, without the URL's ``?query`` (which may carry
    options or secrets that must not reach a file name); None for any other URL."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    return Path(url.removeprefix(SQLITE_PREFIX).partition("?")[0]).expanduser()
