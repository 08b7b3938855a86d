"""MLflow tracking: parent per study, child per trial, resume under the same parent, artifacts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from mlflow import MlflowClient

from paretorch.pipeline.tracking.artifacts import artifact_root_for
from paretorch.pipeline.tracking.tracker import PARENT_TAG, Tracker, clean_key, display_value, experiment_name


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def test_study_parent_and_trial_children(store: str, tmp_path: Path) -> None:
    tracker = Tracker(store)
    parent = tracker.open_study("digits", "digits-cpu-abc", params={"search.max_drop": 0.01},
                                tags={"pipeline": "model -> prune"})
    tracker.log_trial(0, "COMPLETE", {"runtime": "eager", "prune": "off"}, {"accuracy": 0.99, "latency_ms_p50_b1": 0.2},
                      {"seed": "baseline"})
    tracker.log_trial(1, "PRUNED", {"runtime": "eager", "prune#2.ratio": "0.3"}, {}, {"infeasible_reason": "no"})
    tracker.log_trial(2, "FAIL", {}, {}, {}, texts={"traceback.txt": "Traceback ... RuntimeError: boom"})
    client = MlflowClient(tracking_uri=tracker.uri)  # what the UI reads back
    experiment = client.get_experiment_by_name(experiment_name("digits"))
    assert experiment is not None and experiment.artifact_location == "mlflow-artifacts:/paretorch-digits"
    children = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent}'")
    by_trial = {int(r.data.tags["paretorch.trial"]): r for r in children}
    assert set(by_trial) == {0, 1, 2}
    assert by_trial[0].data.metrics == {"accuracy": 0.99, "latency_ms_p50_b1": 0.2}
    assert by_trial[0].data.params == {"runtime": "eager", "prune": "off"}
    assert by_trial[0].info.status == "FINISHED" and by_trial[1].info.status == "KILLED"
    assert by_trial[2].info.status == "FAILED"
    assert by_trial[1].data.params["prune_2.ratio"] == "0.3"  # '#' is not allowed in MLflow keys
    assert "version.torch" in by_trial[0].data.tags and by_trial[0].data.tags["state"] == "COMPLETE"
    artifacts = [a.path for a in client.list_artifacts(by_trial[2].info.run_id)]
    assert artifacts == ["traceback.txt"]

    # A resumed study logs under the same parent and never duplicates a trial.
    again = Tracker(store)
    assert again.open_study("digits", "digits-cpu-abc", params={}, tags={}) == parent
    assert set(again.children) == {0, 1, 2}
    assert again.log_trial(0, "COMPLETE", {}, {"accuracy": 0.5}, {}) == by_trial[0].info.run_id
    assert client.get_run(by_trial[0].info.run_id).data.metrics["accuracy"] == 0.99
    again.log_trial(3, "COMPLETE", {}, {"accuracy": 0.98}, {})
    assert len(client.search_runs([experiment.experiment_id],
                                  filter_string=f"tags.`{PARENT_TAG}` = '{parent}'")) == 4

    # Pareto tags, trial files (a package directory and a file), the study summary.
    again.set_trial_tags(3, {"pareto": "true"})
    package = tmp_path / "model.mlpackage"
    (package / "Data").mkdir(parents=True)
    (package / "Data" / "weights.bin").write_bytes(b"\0" * 8)
    recipe = tmp_path / "recipe.json"
    recipe.write_text("{}")
    again.log_trial_files(3, {"": [recipe], "export.coreml": [package]})
    run3 = again.children[3]
    assert client.get_run(run3).data.tags["pareto"] == "true"
    assert {a.path for a in client.list_artifacts(run3)} == {"recipe.json", "export.coreml"}
    assert [a.path for a in client.list_artifacts(run3, "export.coreml")] == ["export.coreml/model.mlpackage"]
    figure = Figure()
    figure.add_subplot().plot([1, 2], [3, 4])
    again.log_study_summary({"trial": [3], "accuracy": [0.98]}, {"pareto.png": figure}, {"trials": 4.0})
    # a resumed study logs its summary again: the table is replaced, not appended
    again.log_study_summary({"trial": [3, 5], "accuracy": [0.98, 0.97]}, {"pareto.png": figure}, {"trials": 6.0})
    table = json.loads(Path(client.download_artifacts(parent, "pareto_table.json", str(tmp_path))).read_text())
    assert table == {"columns": ["trial", "accuracy"], "data": [[3, 0.98], [5, 0.97]]}
    again.close_study()
    parent_run = client.get_run(parent)
    assert {a.path for a in client.list_artifacts(parent)} == {"pareto_table.json", "pareto.png"}
    assert parent_run.data.metrics["trials"] == 6.0 and parent_run.info.status == "FINISHED"
    assert parent_run.data.params == {"search.max_drop": "0.01"}


def test_helpers() -> None:
    assert clean_key("prune#2.ratio") == "prune_2.ratio"
    assert artifact_root_for("sqlite:////tmp/x/mlflow.db") == Path("/tmp/x/mlartifacts")
    assert artifact_root_for("http://127.0.0.1:5000") is None


def test_latencies_and_seconds_are_logged_to_four_significant_digits() -> None:
    """The MLflow UI shows a metric as logged (it has no display precision setting): timing noise is cut."""
    assert display_value("latency_ms_p50_b1", 0.123456789) == 0.1235
    assert display_value("detail.latency_ms_p90_b8_ci_low", 12.3456) == 12.35
    assert display_value("seconds_wall", 96.4321) == 96.43
    assert display_value("speedup", 1.23456789) == 1.23456789, "the table's number, to the digit"
    assert display_value("accuracy", 0.987406) == 0.987406
    assert display_value("size_bytes", 371712.0) == 371712.0
