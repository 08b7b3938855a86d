"""Links into the MLflow UI that open where a user should start.

MLflow 3.17 opens an experiment on its GenAI "Traces" page; the runs table of a training
experiment is at ``#/experiments/<id>/runs?workflowType=machine_learning``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from pipeline.tracking.tracker import experiment_name

#: Prefix of the metrics that are not headline numbers (MLflow groups them under it).
DETAIL_PREFIX = "detail."


def runs_view_url(base: str, experiment_id: str) -> str:
    """The runs table (model-training view) of one experiment."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def run_view_url(base: str, experiment_id: str, run_id: str, artifact: str | None = None) -> str:
    """One run's page in the model-training view (e.g. a study's parent run: its Description is the
    Pareto table); with ``artifact``, its Artifacts tab opened on that file (e.g. ``pareto.png``)."""
    page = f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    if artifact is not None:
        page += f"/artifacts/{artifact}"
    return f"{page}?workflowType=machine_learning"


#: The run tag MLflow renders as the run's Description (Markdown).
NOTE_TAG = "mlflow.note.content"


def markdown_table(columns: Mapping[str, list[object]]) -> str:
    """A Markdown table from ``{header: values}`` (pipes in cells escaped)."""
    headers = list(columns)
    rows = zip(*(columns[h] for h in headers), strict=True)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(lines)


def experiment_links(tracking_uri: str, base: str) -> list[tuple[str, str]]:
    """(experiment name, runs-view URL) for each paretorch experiment in the store, newest first."""
    from mlflow import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # schema creation on a new store logs at INFO
    logging.getLogger("alembic").setLevel(logging.WARNING)
    client = MlflowClient(tracking_uri=tracking_uri)
    prefix = experiment_name("")
    experiments = [e for e in client.search_experiments() if e.name.startswith(prefix)]
    experiments.sort(key=lambda e: e.last_update_time or 0, reverse=True)
    return [(e.name, runs_view_url(base, e.experiment_id)) for e in experiments]


def namespace_metrics(metrics: Mapping[str, float], headline: Collection[str]) -> dict[str, float]:
    """The headline metrics as they are; every other one under ``detail.`` (namespaced keys, e.g.
    ``export.onnx.x``, are kept as they are), so the runs table leads with the numbers that matter."""
    return {k if k in headline or "." in k else f"{DETAIL_PREFIX}{k}": v for k, v in metrics.items()}
