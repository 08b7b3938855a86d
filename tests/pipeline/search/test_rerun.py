"""Re-runs and resumes are honest: a finished study runs nothing and changes nothing; a resume counts
trials as the budget does and adds its seconds to the study's total; recorded reasons are plain text."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import torch
from mlflow import MlflowClient
from rich.console import Console

from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.search import Search, SearchConfig, SearchOutcome, run_search
from paretorch.pipeline.search.record import FAIL, PRUNED, TrialRecord

CPU = torch.device("cpu")


def _run(spec: ModelSpec, config: SearchConfig, folder: Path, trials: int,
         track: bool = True) -> tuple[SearchOutcome, str]:
    stream = io.StringIO()
    search = Search(spec, CPU, config, storage=f"sqlite:///{folder / 'optuna.db'}",
                    tracking_uri=f"sqlite:///{folder / 'mlflow.db'}", track=track)
    outcome = run_search(search, trials=trials, console=Console(file=stream, width=300))
    return outcome, stream.getvalue()


def _table(client: MlflowClient, run_id: str, folder: Path) -> dict[str, list[object]]:
    target = folder / run_id
    target.mkdir(parents=True, exist_ok=True)
    return json.loads(Path(client.download_artifacts(run_id, "pareto_table.json", str(target))).read_text())


def test_rerunning_a_finished_study_appends_nothing_and_overwrites_nothing(
    residual_spec: ModelSpec, tmp_path: Path
) -> None:
    config = SearchConfig.load(None, sampler="random", runtimes=("eager",), latency_budget="quick", exports="none",
                               seeds=[])
    first, _ = _run(residual_spec, config, tmp_path, trials=2)
    client = MlflowClient(tracking_uri=first.tracking_uri)
    assert first.parent_run_id is not None
    before = client.get_run(first.parent_run_id)
    table = _table(client, first.parent_run_id, tmp_path / "first")
    tied = table["columns"].index("tied_with")
    assert all(isinstance(row[tied], str) for row in table["data"]), "one type per column"
    children = client.search_runs([before.info.experiment_id], "tags.`paretorch.role` = 'trial'")

    again, output = _run(residual_spec, config, tmp_path, trials=2)
    assert output.splitlines()[1] == f"study {first.study_name} has 2 of 2 trials; nothing to run"
    assert "running" not in output and "re-measuring" not in output
    assert len(again.study.trials) == len(first.study.trials)
    after = client.get_run(first.parent_run_id)
    assert after.data.metrics == before.data.metrics, "seconds_wall and the rest stay the first run's"
    assert (after.info.status, after.info.end_time) == (before.info.status, before.info.end_time) == (
        "FINISHED", before.info.end_time)
    assert len(client.get_metric_history(first.parent_run_id, "seconds_wall")) == 1
    assert _table(client, first.parent_run_id, tmp_path / "again") == table
    assert len(client.search_runs([before.info.experiment_id], "tags.`paretorch.role` = 'trial'")) == len(children)
    assert "re-timed: when the study's trials last ran (stored; nothing ran since)" in str(again.table.caption)

    # A resume that runs a trial adds its seconds to the study's total over its runs, as the next step.
    _run(residual_spec, config, tmp_path, trials=3)
    history = client.get_metric_history(first.parent_run_id, "seconds_wall")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == [0, 1]
    assert max(m.value for m in history) > before.data.metrics["seconds_wall"]


def test_the_resume_line_counts_trials_as_the_budget_does(
    residual_spec: ModelSpec, tmp_path: Path, stages_except: Callable[..., tuple[str, ...]]
) -> None:
    config = SearchConfig.load(None, pipeline="default", sampler="random", runtimes=("eager",),
                               latency_budget="quick", exports="none", seeds=[],
                               disabled=stages_except("prune", "distill", "quantize"))
    search = Search(residual_spec, CPU, config, storage=f"sqlite:///{tmp_path / 'optuna.db'}", track=False)
    study = search.store.open_study()
    search.ensure_baseline(study)
    # a repeat of the baseline (every other stage, a plugin's too, is disabled above):
    study.enqueue_trial({"prune.enabled": False, "distill.enabled": False, "quantize.method": "none"})
    assert len(run_search(search, trials=2, console=Console(file=io.StringIO())).study.trials) == 3
    _, output = _run(residual_spec, config, tmp_path, trials=3, track=False)
    assert (f"study {search.store.study_name}: 2 trial(s) done (and 1 repeat(s), ruled-out or interrupted "
            "configuration(s), not counted), running 1 more") in output
    assert "-> " not in output, "trial lines name no export: exports run at the end, for the front only"
    assert "exports (coreml, onnx)" not in output and "no exports" in output


def test_a_recorded_reason_has_no_escape_codes() -> None:
    infeasible = TrialRecord(number=1, state=PRUNED, runtime="eager",
                             infeasible="quantize: \x1b[1m\x1b[31merror:\x1b[0m no int4 kernel on cpu")
    assert infeasible.reason() == "infeasible: quantize: error: no int4 kernel on cpu"
    assert infeasible.tracking_tags({})["infeasible_reason"] == "quantize: error: no int4 kernel on cpu"
    failed = TrialRecord(number=2, state=FAIL, runtime="eager",
                         error="Traceback ...\n\x1b[31mRuntimeError\x1b[0m: \x1b[1mboom\x1b[0m\n")
    assert failed.tracking_tags({})["error"] == "RuntimeError: boom" and "\x1b" not in failed.texts()["traceback.txt"]
