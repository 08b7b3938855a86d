"""The two store flags checked before anything opens them: ``--storage`` (the Optuna study) and ``--tracking-uri``
(MLflow). A URL neither can open is one ``error:`` line that lists the accepted forms; a local file (SQLite or an
Optuna journal) whose directory does not exist is one too, unless that directory lies in the results folder: a
directory outside it is never created silently (a typo would make ``/nonexistent/dir`` at the root)."""

from __future__ import annotations

from pathlib import Path

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.paths import JOURNAL_PREFIX, local_path, results_dir, sqlite_file
from paretorch.pipeline.core.secrets import mask_secrets

#: What ``--storage`` accepts, as its errors list it.
STORAGE_FORMS = ("sqlite:///PATH (one machine; the file's directory must exist), journal:PATH (one machine, Optuna's "
                 "journal file) or postgresql://USER:PASSWORD@HOST/DB (several machines)")
#: The SQLAlchemy dialects an Optuna storage URL may name (a driver may follow: ``postgresql+psycopg://``).
STORAGE_SCHEMES = ("sqlite", "postgresql")

#: What ``--tracking-uri`` accepts, as its errors list it.
TRACKING_FORMS = ("sqlite:///PATH (a local store; the default is mlflow.db in the results folder), http://HOST:PORT "
                  "or https://... (an MLflow server), or a database MLflow writes to (postgresql://, mysql://, "
                  "mssql://); or pass --no-tracking")
#: The schemes of the MLflow stores this tool writes to (MLflow's file store is retired: not listed).
TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql")


def validate_storage_url(url: str) -> None:
    """Refuse a ``--storage`` URL this tool cannot open, or a local file in a missing directory outside the results
    folder: one :class:`ConfigError` naming the flag and what to pass."""
    given = f"--storage {mask_secrets(url)}"
    if url.startswith(JOURNAL_PREFIX):
        if not url.removeprefix(JOURNAL_PREFIX):
            raise ConfigError("--storage journal:PATH needs a file path (e.g. journal:runs/optuna.journal)")
    elif _scheme(url) not in STORAGE_SCHEMES:
        raise ConfigError(f"{given}: not a storage URL this tool opens; use {STORAGE_FORMS}")
    _require_directory(local_path(url), given)


def validate_tracking_uri(uri: str) -> None:
    """Refuse a ``--tracking-uri`` that is no MLflow store this tool writes to, or a SQLite file in a missing
    directory outside the results folder: one :class:`ConfigError` naming the flag and what to pass."""
    given = f"--tracking-uri {mask_secrets(uri)}"
    if _scheme(uri) not in TRACKING_SCHEMES:
        raise ConfigError(f"{given}: not an MLflow store this tool opens; use {TRACKING_FORMS}")
    database = sqlite_file(uri)
    _require_directory(database.resolve() if database is not None else None, given)


def _scheme(url: str) -> str | None:
    """``postgresql`` for ``postgresql+psycopg://...``; None without ``://``."""
    return url.partition("://")[0].partition("+")[0].lower() if "://" in url else None


def _require_directory(path: Path | None, given: str) -> None:
    """One error unless ``path``'s directory exists or lies in the results folder (which creates it)."""
    if path is None or path.parent.is_dir():
        return
    results = results_dir()
    if not path.parent.is_relative_to(results):
        raise ConfigError(f"{given}: the directory {path.parent} does not exist (only folders in the results folder "
                          f"{results} are created): create it, or choose a file in an existing directory")
