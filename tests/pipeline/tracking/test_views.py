"""Links into the MLflow UI, headline metrics, the parent run's Markdown table."""

from __future__ import annotations

from pipeline.tracking.views import markdown_table, namespace_metrics, run_view_url, runs_view_url


def test_links_open_the_model_training_view() -> None:
    assert runs_view_url("http://127.0.0.1:5000/", "3") == \
        "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning"
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
