"""End to end on the digits spec, CPU: `make optimize`, resume, MLflow (store and UI), report, apply.

The study: baseline, the default seeds (prune-0.3-distill reuses the prune-0.3 model from the
cache), two enqueued recipes (prune 0.3 + int8 and int4 weight-only quantization, infeasible on a
CPU; they run after the seeds, in the resumed process), then sampled trials. Quick latency
settings, eager runtime, one thread: a few minutes in all.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from mlflow import MlflowClient
from torch import nn

from paretorch.experiments.screenshots import chromium, free_port, serving, take
from paretorch.pipeline.api import load_deployment
from paretorch.pipeline.search.pareto import pareto_trials
from paretorch.pipeline.sources.resolve import resolve_spec

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SEARCH_ARGS = "--latency-budget quick --runtimes eager"
OPTIMIZE_ARGS = f"{SEARCH_ARGS} --threads 1"


@dataclass
class Study:
    results: Path
    optimize_output: str = ""
    resume_output: str = ""
    trials_after_first: int = 0
    parents_after_first: tuple[str, ...] = ()

    @property
    def study(self) -> optuna.Study:
        storage = f"sqlite:///{self.results / 'optuna.db'}"
        names = optuna.get_all_study_names(storage)
        assert len(names) == 1, names
        return optuna.load_study(study_name=names[0], storage=storage)

    @property
    def mlflow(self) -> MlflowClient:
        return MlflowClient(tracking_uri=f"sqlite:///{self.results / 'mlflow.db'}")

    def experiment_id(self) -> str:
        experiment = self.mlflow.get_experiment_by_name("paretorch/digits")
        assert experiment is not None
        return str(experiment.experiment_id)

    def runs(self, role: str) -> list[Any]:
        return self.mlflow.search_runs([self.experiment_id()], filter_string=f"tags.`paretorch.role` = '{role}'")


def counted(trials: list[Any]) -> list[Any]:
    """The finished trials that count against the budget (repeats of a measured recipe do not; a
    seed still waiting for its turn has not run)."""
    return [t for t in trials if "paretorch.repeat_of" not in t.user_attrs and t.state.is_finished()]


def run(command: list[str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-4000:]}\n" \
                                   f"{result.stderr[-6000:]}"
    return result


def make(target: str, results: Path, *variables: str) -> subprocess.CompletedProcess[str]:
    return run(["make", "--no-print-directory", target, "MODEL=digits", f"RESULTS={results}", *variables])


def write_recipe(path: Path, stages: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"format": "paretorch-recipe/1", "model": "digits", "runtime": "eager",
                                "stages": stages}))
    return path


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory, digits_model: nn.Module, results_dir: Path) -> Study:
    """`make optimize TRIALS=6`, then `make optimize TRIALS=8` (resume), into one temporary results dir."""
    results = tmp_path_factory.mktemp("e2e-results")
    # Reuse the session's trained digits weights instead of training again.
    shutil.copytree(results_dir / "cache" / "weights", results / "cache" / "weights")
    recipes = tmp_path_factory.mktemp("e2e-recipes")
    shared = write_recipe(recipes / "prune-0.3-int8.json", [{"stage": "prune", "ratio": 0.3},
                                                            {"stage": "quantize", "method": "int8_dynamic"}])
    infeasible = write_recipe(recipes / "int4-weight-only.json", [{"stage": "quantize", "method": "int4_weight_only"}])
    args = f"ARGS={OPTIMIZE_ARGS} --enqueue {shared} --enqueue {infeasible}"
    state = Study(results, optimize_output=make("optimize", results, "TRIALS=6", args).stdout)
    state.trials_after_first = len(counted(state.study.trials))
    state.parents_after_first = tuple(r.info.run_id for r in state.runs("study"))
    state.resume_output = make("optimize", results, "TRIALS=8", args).stdout
    return state


def test_first_run_made_six_trials_baseline_first(optimized: Study) -> None:
    assert optimized.trials_after_first == 6
    trials = optimized.study.trials
    assert trials[0].user_attrs["paretorch.seed"] == "baseline"
    assert trials[0].state.name == "COMPLETE"
    assert "Pareto front" in optimized.optimize_output and "speed-up" in optimized.optimize_output
    assert "search, tracking and I/O" in optimized.optimize_output and "study_start" in optimized.optimize_output


def test_resume_continues_to_eight_under_the_same_parent(optimized: Study) -> None:
    assert len(counted(optimized.study.trials)) == 8
    parents = optimized.runs("study")
    assert tuple(r.info.run_id for r in parents) == optimized.parents_after_first
    assert "6 trial(s) done, running 2 more" in optimized.resume_output


def test_mlflow_children_carry_the_trial_values(optimized: Study) -> None:
    parent = optimized.runs("study")[0]
    children = optimized.runs("trial")
    assert len(children) == 8, "one run per counted trial; repeats have none"
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    by_number = {int(r.data.tags["paretorch.trial"]): r for r in children}
    names = optimized.study.metric_names
    assert names == ["accuracy", "latency_ms_b1_via_speedup"]
    front = {t.number for t in pareto_trials(optimized.study)}
    for trial in counted(optimized.study.trials):
        child = by_number[trial.number]
        assert child.data.tags["state"] == trial.state.name
        if trial.state.name == "PRUNED":  # stopped (the latency probe, a configuration that cannot run): not judged
            assert "feasible" not in child.data.tags and child.data.tags["outcome"].startswith("stopped: ")
        else:
            assert child.data.tags["feasible"] == str(trial.user_attrs["paretorch.feasible"]).lower()
        if trial.number in front:
            assert child.data.tags["pareto"] == "true" and "reason" not in child.data.tags
        elif trial.state.name == "COMPLETE" and trial.user_attrs.get("paretorch.latency_unstable"):
            # timing not trusted on a busy machine: off the front, and the run says why
            assert child.data.tags["reason"] == child.data.tags["latency_unstable"] == trial.user_attrs[
                "paretorch.latency_unstable"] and child.data.tags["pareto"] == "false"
        elif trial.state.name == "COMPLETE" and trial.user_attrs["paretorch.feasible"]:
            beaten, tied = child.data.tags.get("dominated_by"), child.data.tags.get("tied_with")
            # beaten by a front trial: a row of the table, or one listed after ~ in a row (tied with its lead)
            winner = int(beaten or tied or -1)
            tags = by_number[winner].data.tags if beaten and winner in by_number else {}
            winner_tied = tags.get("tied_with") or tags.get("same_as")
            assert winner in front or (winner_tied is not None and int(winner_tied) in front), (
                "beaten by or tied with a front trial")
        else:
            assert child.data.tags["reason"]
        if trial.state.name == "COMPLETE":
            # latencies are logged to 4 significant digits (paretorch.pipeline.tracking.tracker.display_value)
            assert [child.data.metrics[name] for name in names] == pytest.approx(trial.values, rel=1e-3)
            assert child.data.params["runtime"] == "eager"
            assert "version.torch" in child.data.tags


def test_a_pareto_trial_has_coreml_and_onnx_artifacts(optimized: Study) -> None:
    client = optimized.mlflow
    pareto = [r for r in optimized.runs("trial") if r.data.tags.get("pareto") == "true"]
    assert pareto
    found = []
    for run_info in pareto:
        run_id = run_info.info.run_id
        coreml = [a.path for a in client.list_artifacts(run_id, "export.coreml")]
        onnx = [a.path for a in client.list_artifacts(run_id, "export.onnx")]
        root = [a.path for a in client.list_artifacts(run_id)]
        if any(p.endswith(".mlpackage") for p in coreml) and any(p.endswith(".onnx") for p in onnx):
            assert "recipe.json" in root
            found.append(run_id)
    assert found, "no Pareto trial carries both a .mlpackage and an .onnx artifact"
    parent = optimized.runs("study")[0].info.run_id
    assert {"pareto_table.json", "pareto.png", "pareto.html"} <= {a.path for a in client.list_artifacts(parent)}


def test_each_pareto_trials_files_sit_in_its_study_folder_and_are_printed(optimized: Study) -> None:
    study = optimized.study
    for trial in study.best_trials:
        folder = optimized.results / "studies" / study.study_name / f"trial-{trial.number:03d}"
        assert {"recipe.json", "digits.onnx", "digits.mlpackage", "deploy"} <= {p.name for p in folder.iterdir()}
        assert f"{folder / 'digits.onnx'}" in optimized.optimize_output + optimized.resume_output
        # Every front trial ships its deployment: the callable load_deployment rebuilds, host batches in.
        assert {"deployment.json", "recipe.json"} <= {p.name for p in (folder / "deploy").iterdir()}
    spec = resolve_spec("digits")
    deployed = load_deployment(folder / "deploy", spec)
    inputs = spec.example_inputs(4)
    assert deployed(*inputs).shape == (4, 10) and deployed(*inputs).dtype == torch.float32


def test_runs_are_named_by_their_short_recipe(optimized: Study) -> None:
    names = {int(r.data.tags["paretorch.trial"]): r.info.run_name for r in optimized.runs("trial")}
    assert names[0] == "000 baseline | eager"
    assert all(name.startswith(f"{number:03d} ") and name.endswith(" | eager") for number, name in names.items())


def test_shared_prune_config_hits_the_cache(optimized: Study) -> None:
    trial = next(t for t in optimized.study.trials if t.user_attrs.get("paretorch.seed") == "prune-0.3-distill")
    assert trial.state.name == "COMPLETE"
    assert trial.user_attrs["paretorch.cache"]["hits"] > 0, "the prune-0.3 seed's model is reused"
    enqueued = next(t for t in optimized.study.trials if t.user_attrs.get("paretorch.seed") == "prune-0.3-int8")
    # int8 dynamic on digits' tiny layers runs slower than fp32 in eager: the latency probe may stop it, after
    # the shared prune stage has come from the cache.
    assert enqueued.state.name in {"COMPLETE", "PRUNED"}
    assert enqueued.state.name == "COMPLETE" or "latency probe" in enqueued.user_attrs["paretorch.infeasible"]
    assert enqueued.user_attrs["paretorch.cache"]["hits"] > 0, "the enqueued recipe reuses the prune-0.3 model"


def test_infeasible_config_is_a_pruned_trial_with_its_reason(optimized: Study) -> None:
    trial = next(t for t in optimized.study.trials if t.user_attrs.get("paretorch.seed") == "int4-weight-only")
    assert trial.state.name == "PRUNED"
    reason = trial.user_attrs["paretorch.infeasible"]
    assert "int4_weight_only cannot run on cpu" in reason
    child = next(r for r in optimized.runs("trial") if r.data.tags["paretorch.trial"] == str(trial.number))
    assert child.data.tags["infeasible_reason"] == reason


def test_report_prints_the_table_again(optimized: Study) -> None:
    output = make("report", optimized.results, f"ARGS={SEARCH_ARGS}").stdout
    assert "Pareto front of digits-cpu-" in output
    front = pareto_trials(optimized.study)
    rows = output.splitlines()
    assert all(any(row.startswith(f"{t.number:>5}  ") for row in rows) for t in front)


def test_pareto_recipe_replays_to_the_same_metric(optimized: Study, tmp_path: Path) -> None:
    study = optimized.study
    trial = max(pareto_trials(study), key=lambda t: len(t.user_attrs["paretorch.recipe"]["stages"]))
    recipe = optimized.results / "studies" / study.study_name / f"trial-{trial.number:03d}" / "recipe.json"
    assert recipe.is_file()
    run([sys.executable, "-m", "paretorch", "apply", "--recipe", str(recipe), "--model", "digits",
                  "--results-dir", str(optimized.results), "--output", str(tmp_path), "--json", "--threads", "1",
                  "--latency-budget", "quick"])
    summary = json.loads((tmp_path / "apply.json").read_text())
    assert summary["metrics"]["accuracy"] == pytest.approx(trial.values[0], abs=1e-9)
    assert {Path(e["path"]).suffix for e in summary["exports"].values()} == {".mlpackage", ".onnx"}
    assert all(Path(e["path"]).exists() for e in summary["exports"].values())


@pytest.fixture(scope="module")
def ui(optimized: Study, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`make ui` over the study's results, started once for the tests that read it: its base URL and its log."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("ui") / "ui.log"
    with serving(["make", "--no-print-directory", "-C", str(REPO), "ui", f"RESULTS={optimized.results}",
                  f"UI_PORT={port}"], f"{base}/health", log):
        yield base, log


def test_mlflow_ui_answers_a_rest_search(optimized: Study, ui: tuple[str, Path]) -> None:
    base, log = ui
    body = json.dumps({"experiment_ids": [optimized.experiment_id()],
                       "filter": "tags.`paretorch.role` = 'trial'", "max_results": 100}).encode()
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        runs = json.loads(response.read())["runs"]
    assert len(runs) == 8
    assert (f"#/experiments/{optimized.experiment_id()}/runs?workflowType=machine_learning"
            "&viewStateShareKey=paretorch-headline") in log.read_text()


def test_a_copied_results_folder_serves_its_own_artifacts(optimized: Study, tmp_path: Path) -> None:
    """`cp -r runs elsewhere`, change a recipe in the copy, `make ui RESULTS=elsewhere`: the UI's REST API
    lists and serves the copy's files; a client on the original store still reads the original."""
    copy = tmp_path / "copied-results"
    shutil.copytree(optimized.results, copy, ignore=shutil.ignore_patterns("cache", "*.lock"))
    run = next(r for r in optimized.runs("trial") if r.data.tags.get("pareto") == "true"
               and "recipe.json" in {a.path for a in optimized.mlflow.list_artifacts(r.info.run_id)})
    run_id = run.info.run_id
    assert run.info.artifact_uri == f"mlflow-artifacts:/paretorch-digits/{run_id}/artifacts"
    copied_recipe = copy / "mlartifacts" / "paretorch-digits" / run_id / "artifacts" / "recipe.json"
    original = copied_recipe.read_text()
    copied_recipe.write_text('{"edited": "in the copy"}')
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with serving(["make", "--no-print-directory", "-C", str(REPO), "ui", f"RESULTS={copy}", f"UI_PORT={port}"],
                 f"{base}/health", tmp_path / "ui.log"):
        with urllib.request.urlopen(f"{base}/api/2.0/mlflow/artifacts/list?run_id={run_id}", timeout=30) as answer:
            listed = {f["path"] for f in json.loads(answer.read())["files"]}
        with urllib.request.urlopen(f"{base}/get-artifact?run_id={run_id}&path=recipe.json", timeout=30) as answer:
            served = answer.read().decode()
    assert {"recipe.json", "export.coreml", "export.onnx"} <= listed
    assert served == '{"edited": "in the copy"}'
    downloaded = optimized.mlflow.download_artifacts(run_id, "recipe.json", str(tmp_path))
    assert Path(downloaded).read_text() == original


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (Debian: apt-get install -y chromium)")
def test_headless_browser_screenshots_of_both_uis(optimized: Study, ui: tuple[str, Path], tmp_path: Path) -> None:
    shots = take(optimized.results, tmp_path, "digits", mlflow_base=ui[0])  # the UI `make ui` serves
    names = {p.name for p in shots}
    assert {"mlflow-runs.png", "mlflow-parent-0.png", "dashboard-study.png", "dashboard-trials.png",
            "dashboard-note.png"} <= names
    assert all(p.stat().st_size > 20_000 for p in shots), "a blank page is a few KiB"
