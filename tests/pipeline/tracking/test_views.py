"""Links into the MLflow UI, headline metrics, the parent run's Markdown table."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from mlflow import MlflowClient

from paretorch.pipeline.tracking.columns import (
    CREATED,
    DURATION,
    RANK_METRIC,
    RUN_NAME,
    SORT_METRIC,
    TABLE_WIDTH_1366,
    VIEW_TAG,
    headline_view,
)
from paretorch.pipeline.tracking.tracker import Tracker
from paretorch.pipeline.tracking.views import (
    experiment_links,
    markdown_table,
    namespace_metrics,
    run_view_url,
    runs_view_url,
    study_links,
)

#: The leading metrics a search shows (paretorch.pipeline.search.loop.open_search): the rank, the speed-up, the metric,
#: its drop.
LEADING = (RANK_METRIC, SORT_METRIC, "accuracy", "metric_drop")


def test_links_open_the_model_training_view() -> None:
    assert runs_view_url("http://127.0.0.1:5000/", "3") == \
        "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning"
    assert runs_view_url("http://h:1", "3", "k") == \
        "http://h:1/#/experiments/3/runs?workflowType=machine_learning&viewStateShareKey=k"
    assert run_view_url("http://h:1", "3", "abc", artifact="pareto.png") == \
        "http://h:1/#/experiments/3/runs/abc/artifacts/pareto.png?workflowType=machine_learning"


def test_only_headline_metrics_stay_at_the_top_level() -> None:
    metrics = {"accuracy": 0.9, "metric_drop": 0.01, "params": 10.0, "seconds_trial": 1.0, "export.onnx.x": 2.0}
    assert namespace_metrics(metrics, ("accuracy", "metric_drop")) == {
        "accuracy": 0.9, "metric_drop": 0.01, "detail.params": 10.0, "detail.seconds_trial": 1.0,
        "export.onnx.x": 2.0}


def test_markdown_table_escapes_pipes() -> None:
    text = markdown_table({"trial": [1], "recipe": ["prune | eager"]})
    assert text.splitlines() == ["| trial | recipe |", "|---|---|", "| 1 | prune \\| eager |"]


def test_each_study_adds_its_headline_columns_to_the_experiments_view(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(store)
    tracker.open_study("digits", "study-b32", params={}, tags={})
    assert experiment_links(store, "http://h:1") == [
        ("paretorch/digits", f"http://h:1/#/experiments/{tracker.experiment_id}/runs?workflowType=machine_learning")]
    headline = ("accuracy", "metric_drop", "latency_ms_p50_b32", "speedup", "size_bytes")
    tracker.show_columns(headline, leading=LEADING)
    other = Tracker(store)
    other.open_study("digits", "study-b1", params={}, tags={})
    other.show_columns(("accuracy", "metric_drop", "latency_ms_p50_b1", "speedup", "size_bytes"), leading=LEADING)
    view = json.loads(MlflowClient(tracking_uri=tracker.uri).get_experiment(tracker.experiment_id).tags[VIEW_TAG])
    leading = ["metrics.`front_rank`", "metrics.`speedup`", "metrics.`accuracy`", "metrics.`metric_drop`",
               "tags.`feasible`"]
    assert view["selectedColumns"] == [
        "metrics.`front_rank`", "metrics.`accuracy`", "metrics.`metric_drop`", "metrics.`latency_ms_p50_b32`",
        "metrics.`speedup`", "metrics.`size_bytes`", "tags.`feasible`", "tags.`outcome`", "tags.`pareto`",
        "metrics.`latency_ms_p50_b1`"]
    # the run name (the short recipe), then what a user reads first, then the rest
    assert view["columnOrder"] == [RUN_NAME, CREATED, DURATION, *leading, "metrics.`latency_ms_p50_b32`",
                                   "metrics.`size_bytes`", "tags.`outcome`", "tags.`pareto`",
                                   "metrics.`latency_ms_p50_b1`"]
    # every trial a row of its own (sorted by a metric, the UI does not fold children under the parent), paretorch's
    # best trial first (front_rank 1, the console table's first row)
    assert (view["searchFilter"], view["orderByKey"], view["orderByAsc"]) == (
        "tags.`paretorch.role` = 'trial'", "metrics.`front_rank`", True)
    [(name, url)] = experiment_links(store, "http://h:1")
    assert name == "paretorch/digits"
    assert url.endswith(f"/#/experiments/{tracker.experiment_id}/runs?workflowType=machine_learning"
                        "&viewStateShareKey=paretorch-headline")


def test_the_leading_columns_fit_a_1366_px_screen_with_mlflows_assistant_open() -> None:
    view = json.loads(headline_view(["accuracy", "latency_ms_p50_b1"], leading=LEADING))
    widths = view["columnWidths"]
    assert list(widths) == view["columnOrder"][:8] and view["columnOrder"][3:8] == [
        "metrics.`front_rank`", "metrics.`speedup`", "metrics.`accuracy`", "metrics.`metric_drop`", "tags.`feasible`"]
    assert sum(widths.values()) <= TABLE_WIDTH_1366
    assert {"metrics.`front_rank`", "metrics.`speedup`", "metrics.`metric_drop`"} <= set(view["selectedColumns"])


def test_make_ui_links_each_studys_parent_run(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(store)
    tracker.open_study("digits", "study-a", params={}, tags={})
    assert study_links(store, "http://h:1") == [
        ("study-a", f"http://h:1/#/experiments/{tracker.experiment_id}/runs/{tracker.parent_run_id}"
                    "?workflowType=machine_learning")]


def test_an_unreadable_view_is_replaced_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        view = json.loads(headline_view(["accuracy"], (), previous="{not json"))
    assert view["selectedColumns"] == ["metrics.`accuracy`"]
    assert "replacing the unreadable MLflow runs-table view" in caplog.text
