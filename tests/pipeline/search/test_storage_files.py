"""The files beside a local store are named after its database file, never after the URL's query
(which may carry a password)."""

from __future__ import annotations

from pathlib import Path

from paretorch.pipeline.core.paths import sqlite_file
from paretorch.pipeline.search.storage import StudyLock, local_path, open_storage
from paretorch.pipeline.tracking.artifacts import artifact_root_for
from paretorch.pipeline.tracking.tracker import Tracker

SECRET = "hunter2"


def test_sqlite_file_drops_the_query() -> None:
    assert sqlite_file(f"sqlite:////data/optuna.db?password={SECRET}") == Path("/data/optuna.db")
    assert sqlite_file("postgresql://u:p@h/db") is None
    assert local_path(f"sqlite:////data/optuna.db?password={SECRET}") == Path("/data/optuna.db")
    assert artifact_root_for(f"sqlite:////data/mlflow.db?password={SECRET}") == Path("/data/mlartifacts")


def test_no_file_beside_the_stores_names_the_secret(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}?password={SECRET}"
    storage = open_storage(url)
    lock = StudyLock(url, storage, "study")
    lock.acquire()
    lock.release()
    Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}?password={SECRET}")
    names = [path.name for path in tmp_path.rglob("*")]
    assert "optuna.db" in names and "optuna.db.lock" in names and "optuna.db.study.lock" in names
    assert "mlflow.db" in names and "mlflow.db.lock" in names
    assert not [name for name in names if SECRET in name]
