"""Artifact locations relative to the results folder: a moved or copied folder shows its own files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository

from paretorch.pipeline.core.errors import PipelineError
from paretorch.pipeline.tracking import artifacts
from paretorch.pipeline.tracking.artifacts import experiment_location, local_path
from paretorch.pipeline.tracking.tracker import TRIAL_TAG, Tracker, experiment_name


def store(results: Path) -> str:
    return f"sqlite:///{results / 'mlflow.db'}"


def trial_runs(results: Path) -> dict[int, str]:
    client = MlflowClient(tracking_uri=store(results))
    experiment = client.get_experiment_by_name(experiment_name("digits"))
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{TRIAL_TAG}` != ''")
    return {int(r.data.tags[TRIAL_TAG]): r.info.run_id for r in runs}


def read_artifact(results: Path, run_id: str, path: str, into: Path) -> str:
    client = MlflowClient(tracking_uri=store(results))
    assert [a.path for a in client.list_artifacts(run_id)] == [path]
    into.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, path, str(into))).read_text()


def test_a_moved_then_copied_results_folder_reads_and_writes_its_own_artifacts(tmp_path: Path) -> None:
    first = tmp_path / "runs"
    first.mkdir()
    tracker = Tracker(store(first))
    tracker.open_study("digits", "study", params={}, tags={})
    tracker.log_trial(0, "COMPLETE", {}, {"accuracy": 0.9}, {}, texts={"recipe.json": "first"})
    experiment = MlflowClient(tracking_uri=tracker.uri).get_experiment(tracker.experiment_id)
    assert experiment.artifact_location == "mlflow-artifacts:/paretorch-digits"

    moved = tmp_path / "moved"
    shutil.move(first, moved)
    run0 = trial_runs(moved)[0]
    assert read_artifact(moved, run0, "recipe.json", tmp_path / "d1") == "first"

    # Logging into the moved store (a resumed study) writes under the moved folder.
    again = Tracker(store(moved))
    again.open_study("digits", "study", params={}, tags={})
    again.log_trial(1, "COMPLETE", {}, {"accuracy": 0.8}, {}, texts={"recipe.json": "second"})
    assert (moved / "mlartifacts" / "paretorch-digits" / again.children[1] / "artifacts" / "recipe.json").is_file()

    # A copy reads its own files, not the original's.
    copy = tmp_path / "copy"
    shutil.copytree(moved, copy)
    (copy / "mlartifacts" / "paretorch-digits" / run0 / "artifacts" / "recipe.json").write_text("edited copy")
    assert read_artifact(copy, run0, "recipe.json", tmp_path / "d2") == "edited copy"
    assert read_artifact(moved, run0, "recipe.json", tmp_path / "d3") == "first"


def test_mlflow_resolves_the_scheme_through_the_installed_entry_point(tmp_path: Path) -> None:
    local = get_artifact_repository("mlflow-artifacts:/paretorch-digits/abc/artifacts",
                                    tracking_uri=store(tmp_path))
    assert isinstance(local, LocalArtifactRepository)
    assert Path(local.artifact_dir) == tmp_path.resolve() / "mlartifacts" / "paretorch-digits" / "abc" / "artifacts"
    served = get_artifact_repository("mlflow-artifacts:/paretorch-digits/abc", tracking_uri="http://127.0.0.1:5000")
    assert isinstance(served, MlflowArtifactsRepository)
    assert served.artifact_uri == "http://127.0.0.1:5000/api/2.0/mlflow-artifacts/artifacts/paretorch-digits/abc"


def test_a_stale_install_is_one_error_that_says_to_reinstall(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert artifacts.registered()
    monkeypatch.setattr(artifacts, "ENTRY_POINT", "somewhere.else:repository")
    with pytest.raises(PipelineError, match=r"reinstall it \(make setup"):
        Tracker(store(tmp_path))


def test_paths_stay_inside_the_artifact_root(tmp_path: Path) -> None:
    assert local_path("mlflow-artifacts:/e/r/artifacts", tmp_path) == tmp_path / "e" / "r" / "artifacts"
    assert local_path("mlflow-artifacts:/", tmp_path) == tmp_path
    with pytest.raises(ValueError, match="inside the artifact root"):
        local_path("mlflow-artifacts:/e/../../etc", tmp_path)
    with pytest.raises(ValueError, match="inside the artifact root"):
        local_path("mlflow-artifacts://host:5000/e", tmp_path)
    assert experiment_location("paretorch-digits") == "mlflow-artifacts:/paretorch-digits"
    with pytest.raises(ValueError, match="one path component"):
        experiment_location("a/b")
