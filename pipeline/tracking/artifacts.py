"""Artifact locations that move with the results folder.

A local store's experiments keep their artifacts under ``mlflow-artifacts:/<experiment folder>``,
a URI relative to the artifact root instead of an absolute ``file://`` path, so a moved or
copied results folder shows its own files:

* ``make ui`` serves the store with ``--artifacts-destination <results>/mlartifacts``; MLflow's
  server resolves ``mlflow-artifacts:`` URIs against that folder (proxied artifact serving).
* Without a server, MLflow only resolves ``mlflow-artifacts:`` through an ``http(s)`` tracking URI.
  :func:`repository`, registered for the scheme through MLflow's ``mlflow.artifact_repository``
  entry points (``pyproject.toml``), resolves it for a local SQLite store against the
  ``mlartifacts/`` folder beside the database (the pipeline's logging, ``MlflowClient`` in a
  script), and hands every other tracking URI to MLflow's own repository unchanged.

A store on a server (``--tracking-uri http://...``) keeps the locations its server chooses.
"""

from __future__ import annotations

import posixpath
import urllib.parse
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from paretorch.pipeline.core.paths import sqlite_file

if TYPE_CHECKING:
    from mlflow.store.artifact.artifact_repo import ArtifactRepository

#: MLflow's scheme for artifacts relative to the artifact root a server serves.
PROXY_SCHEME = "mlflow-artifacts"
#: The folder beside a local store's database that holds its artifacts.
ARTIFACTS_FOLDER = "mlartifacts"
#: MLflow's entry-point group for artifact repositories, and this module's entry in it (pyproject.toml).
ENTRY_POINT_GROUP = "mlflow.artifact_repository"
ENTRY_POINT = f"{__name__}:repository"


def registered() -> bool:
    """Whether the installed package metadata registers :func:`repository` with MLflow (an install from
    before it does not: MLflow would then refuse the store's ``mlflow-artifacts:`` locations)."""
    return any(e.name == PROXY_SCHEME and e.value == ENTRY_POINT
               for e in metadata.entry_points(group=ENTRY_POINT_GROUP))


def artifact_root_for(uri: str) -> Path | None:
    """Where a local store keeps artifacts: ``mlartifacts/`` beside a SQLite file; None for a server
    or another database (it decides)."""
    database = sqlite_file(uri)
    return database.parent / ARTIFACTS_FOLDER if database is not None else None


def experiment_location(folder: str) -> str:
    """The artifact location of an experiment kept in ``<artifact root>/<folder>``."""
    if not folder or "/" in folder or folder in (".", ".."):
        raise ValueError(f"an experiment's artifact folder is one path component, not {folder!r}")
    return f"{PROXY_SCHEME}:/{folder}"


def local_path(artifact_uri: str, root: Path) -> Path:
    """The file or folder an ``mlflow-artifacts:/...`` URI names under ``root``."""
    parts = urllib.parse.urlsplit(artifact_uri)
    relative = posixpath.normpath(parts.path.lstrip("/")) if parts.path.strip("/") else ""
    if parts.scheme != PROXY_SCHEME or parts.netloc or relative == ".." or relative.startswith("../"):
        raise ValueError(f"{artifact_uri} is not an {PROXY_SCHEME}:/ path inside the artifact root")
    return root / relative if relative else root


def repository(artifact_uri: str, tracking_uri: str | None = None,
               registry_uri: str | None = None) -> ArtifactRepository:
    """MLflow's artifact repository for an ``mlflow-artifacts:`` URI: the local folder under a SQLite
    store's ``mlartifacts/``, or MLflow's own proxy client for any other tracking URI."""
    import mlflow
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
    from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository

    uri = tracking_uri or mlflow.get_tracking_uri()
    root = artifact_root_for(uri)
    if root is None or urllib.parse.urlsplit(artifact_uri).netloc:
        return MlflowArtifactsRepository(artifact_uri, tracking_uri=tracking_uri, registry_uri=registry_uri)
    path = local_path(artifact_uri, root.resolve())
    return LocalArtifactRepository(path.as_uri(), tracking_uri=tracking_uri, registry_uri=registry_uri)
