"""Where the project writes: one results directory for everything."""

from __future__ import annotations

import os
from pathlib import Path

from paretorch.pipeline.core.errors import ConfigError
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


def pipeline_file(ref: str | Path) -> Path:
    """The YAML file of ``--pipeline ref`` other than ``default``: a path, or a name in :data:`PIPELINES_DIR`; one
    :class:`ConfigError` when there is none."""
    path = Path(ref)
    if not path.exists() and (PIPELINES_DIR / f"{ref}.yaml").exists():
        path = PIPELINES_DIR / f"{ref}.yaml"
    if not path.is_file():
        shipped = sorted(p.stem for p in PIPELINES_DIR.glob("*.yaml")) if PIPELINES_DIR.is_dir() else []
        raise ConfigError(f"pipeline '{ref}' not found: use 'default', a YAML path, or one of {shipped}")
    return path


SQLITE_PREFIX = "sqlite:///"


def sqlite_file(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL, without the URL's ``?query`` (which may carry
    options or secrets that must not reach a file name); None for any other URL."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    return Path(url.removeprefix(SQLITE_PREFIX).partition("?")[0]).expanduser()


#: An Optuna journal file as a ``--storage`` (``journal:PATH``).
JOURNAL_PREFIX = "journal:"


def local_path(url: str) -> Path | None:
    """The file of a local Optuna storage (SQLite or journal), None for a server."""
    if url.startswith(JOURNAL_PREFIX):
        return Path(url.removeprefix(JOURNAL_PREFIX)).expanduser().resolve()
    database = sqlite_file(url)
    return database.resolve() if database is not None else None
