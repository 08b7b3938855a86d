"""Links into the MLflow UI that open where a user should start.

MLflow 3.17 opens an experiment on its GenAI "Traces" page; the runs table of a training
experiment is at ``#/experiments/<id>/runs?workflowType=machine_learning``, and
``&viewStateShareKey=<key>`` opens it with a shared view's columns (``paretorch.pipeline.tracking.columns``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from paretorch.pipeline.tracking.columns import VIEW_KEY, VIEW_PARAMETER, VIEW_TAG
from paretorch.pipeline.tracking.tracker import ROLE_TAG, STUDY_TAG, experiment_name

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Experiment

#: Prefix of the metrics that are not headline numbers (MLflow groups them under it).
DETAIL_PREFIX = "detail."


def runs_view_url(base: str, experiment_id: str, view_key: str | None = None) -> str:
    """The runs table (model-training view) of one experiment; with ``view_key``, opened on that shared
    view (its columns: ``paretorch.pipeline.tracking.columns``)."""
    url = f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    return f"{url}&{VIEW_PARAMETER}={view_key}" if view_key else url


def experiment_url(base: str, experiment: Experiment) -> str:
    """The runs table of ``experiment``, on paretorch's headline columns where a study has set them."""
    return runs_view_url(base, experiment.experiment_id, VIEW_KEY if VIEW_TAG in experiment.tags else None)


def run_view_url(base: str, experiment_id: str, run_id: str, artifact: str | None = None) -> str:
    """One run's page in the model-training view (e.g. a study's parent run: its Description is the
    Pareto table); with ``artifact``, its Artifacts tab opened on that file (e.g. ``pareto.png``)."""
    page = f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    if artifact is not None:
        page += f"/artifacts/{artifact}"
    return f"{page}?workflowType=machine_learning"


def markdown_table(columns: Mapping[str, list[object]]) -> str:
    """A Markdown table from ``{header: values}`` (pipes in cells escaped)."""
    headers = list(columns)
    rows = zip(*(columns[h] for h in headers), strict=True)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(lines)


def experiment_links(tracking_uri: str, base: str) -> list[tuple[str, str]]:
    """(experiment name, runs-view URL) for each paretorch experiment in the store, newest first."""
    return [(e.name, experiment_url(base, e)) for e in _experiments(_client(tracking_uri))]


def study_links(tracking_uri: str, base: str) -> list[tuple[str, str]]:
    """(study name, URL of its parent run) for each study in the store's paretorch experiments, the most recently
    started first: the run whose Description is the Pareto table and whose artifacts hold ``pareto.png``."""
    client = _client(tracking_uri)
    links = []
    for experiment in _experiments(client):
        parents = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{ROLE_TAG}` = 'study'",
                                     order_by=["attributes.start_time DESC"], max_results=100)
        links += [(run.data.tags.get(STUDY_TAG, run.info.run_name),
                   run_view_url(base, experiment.experiment_id, run.info.run_id)) for run in parents]
    return links


def _client(tracking_uri: str) -> MlflowClient:
    from mlflow import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # schema creation on a new store logs at INFO
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=tracking_uri)


def _experiments(client: MlflowClient) -> list[Experiment]:
    """The store's paretorch experiments, the most recently updated first."""
    prefix = experiment_name("")
    experiments = [e for e in client.search_experiments() if e.name.startswith(prefix)]
    experiments.sort(key=lambda e: e.last_update_time or 0, reverse=True)
    return experiments


def namespace_metrics(metrics: Mapping[str, float], headline: Collection[str]) -> dict[str, float]:
    """The headline metrics as they are; every other one under ``detail.`` (namespaced keys, e.g.
    ``export.onnx.x``, are kept as they are), so the runs table leads with the numbers that matter."""
    return {k if k in headline or "." in k else f"{DETAIL_PREFIX}{k}": v for k, v in metrics.items()}
