"""One best everywhere: the console's time-to-result line, the Pareto table's first rows, the MLflow runs view that
``make ui`` opens (its sort, read back from the study's store) and optuna-dashboard's study note name the same trials
(:func:`paretorch.pipeline.search.pareto.best_trials`); a pruned trial reads as stopped in MLflow, with its reason,
never as infeasible.

The study: digits on a fake clock (each model's latency from its label, no timing noise): the baseline (1.0 ms), a
4x trial with the baseline's accuracy, an 8x trial that misses one row per evaluation batch (a lower accuracy within
the allowed drop: a second lead, the fastest) and a 14x slower one (stopped by the latency probe).
"""

from __future__ import annotations

import inspect
import io
import json
import math
import re
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
import torch
from mlflow import MlflowClient
from rich.console import Console
from torch import Tensor, nn

from paretorch.pipeline.core.paired import Timed
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, registered
from paretorch.pipeline.search import Search, SearchConfig
from paretorch.pipeline.search.finish import front_files
from paretorch.pipeline.search.objectives import ATTR_FEASIBLE, ATTR_METRICS
from paretorch.pipeline.search.pareto import BestTrial, ParetoRow
from paretorch.pipeline.search.record import PRUNED, TrialRecord
from paretorch.pipeline.search.time_to_result import ResultPoint, best_so_far, found_line
from paretorch.pipeline.tracking.columns import RANK_METRIC, VIEW_TAG
from paretorch.pipeline.tracking.tracker import Tracker, experiment_name
from tests.pipeline.search.conftest import run_on_fake_clock, study_detail, trials_by_seed

#: True latency (ms) per label.
TRUE_MS = {None: 1.0, "fast": 0.25, "faster": 0.125, "slow": 14.0}


class MissConfig(StageConfig):
    """Gets the first row of every batch wrong (its logits rolled): a small accuracy drop, labelled ``faster``."""

    stage = "toy.miss"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> MissConfig | None:
        return None


class Missing(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.paretorch_label = "faster"

    def forward(self, x: Tensor) -> Tensor:
        out = self.model(x)
        return torch.cat([out[:1].roll(1, dims=-1), out[1:]])


def apply_miss(model: nn.Module, config: MissConfig, ctx: StageContext) -> nn.Module:
    return Missing(model)


class LabelTimer:
    def warm_up(self, sides: Sequence[Timed]) -> None:
        pass

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        return [TRUE_MS[getattr(inspect.unwrap(fn), "paretorch_label", None)] for fn, _ in sides]


@pytest.fixture(scope="module")
def digits_study(digits_spec: ModelSpec, tag_stage: Stage, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Search]:
    folder = tmp_path_factory.mktemp("best")
    pipeline_file = folder / "labelled.yaml"
    pipeline_file.write_text("nodes:\n  - {op: model}\n  - {op: toy.tag}\n  - {op: toy.miss}\n"
                             "  - {name: evaluate, op: evaluate}\n")
    seeds = [{"name": "fast", "stages": [{"stage": "toy.tag", "label": "fast"}]},
             {"name": "faster", "stages": [{"stage": "toy.miss"}]},
             {"name": "slow", "stages": [{"stage": "toy.tag", "label": "slow"}]}]
    config = SearchConfig.load(None, pipeline=str(pipeline_file), sampler="random", runtimes=("eager",),
                               latency_budget="quick", exports="none", max_drop="5%", seeds=seeds, presets=(),
                               tail_limit="off")  # toy.miss flips a confident row per batch: a tail, here allowed
    with registered(tag_stage), registered(Stage(MissConfig, apply_miss)):  # type: ignore[arg-type]
        yield run_on_fake_clock(digits_spec, config, folder, LabelTimer(), trials=4)


def table_trials(search: Search) -> list[int]:
    """The trial numbers of the printed Pareto table, top to bottom (the baseline's row, trial "-", has none)."""
    output = io.StringIO()
    Console(file=output, width=200).print(search.outcome.table)  # type: ignore[attr-defined]
    return [int(m.group(1)) for line in output.getvalue().splitlines() if (m := re.match(r"\s*(\d+)\s", line))]


def runs_view(search: Search) -> list[dict[str, str]]:
    """The trial runs as the view ``make ui`` opens lists them: its filter and sort, read from the experiment."""
    client = MlflowClient(tracking_uri=search.store.tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name(search.plan.spec.name))
    assert experiment is not None
    view = json.loads(experiment.tags[VIEW_TAG])
    order = f"{view['orderByKey']} {'ASC' if view['orderByAsc'] else 'DESC'}"
    runs = client.search_runs([experiment.experiment_id], filter_string=view["searchFilter"], order_by=[order])
    return [{**r.data.tags, "status": r.info.status, **{f"metric.{k}": str(v) for k, v in r.data.metrics.items()}}
            for r in runs]


def test_the_console_the_table_mlflow_and_the_dashboard_name_the_same_best_trials(digits_study: Search) -> None:
    outcome = digits_study.outcome  # type: ignore[attr-defined]
    trials = trials_by_seed(digits_study)
    fast, faster = trials["fast"].number, trials["faster"].number
    best = [b.number for b in outcome.best]
    assert best == [faster, fast], "two leads, the fastest first: the table's order"
    assert table_trials(digits_study) == best, "under the baseline's row (trial -), the best trials in order"
    assert outcome.found.startswith(f"time to result: the front's lead, trial {faster} (8.00x), found after ")

    runs = runs_view(digits_study)
    assert [int(r["paretorch.trial"]) for r in runs[:2]] == best, "the runs view opens on the best trials"
    assert [float(r[f"metric.{RANK_METRIC}"]) for r in runs[:2]] == [1.0, 2.0]
    assert all(f"metric.{RANK_METRIC}" not in r for r in runs[2:]), "only the front's leads are ranked"
    assert all(r["pareto"] == "true" for r in runs[:2])
    parent = MlflowClient(tracking_uri=digits_study.store.tracking_uri).get_run(outcome.parent_run_id)
    assert f"**paretorch's best trials: {faster}, then {fast}**" in parent.data.tags["mlflow.note.content"]

    study = outcome.study
    note = study_detail(study._storage, study._study_id)["note"]["body"]
    assert note.startswith(f"**paretorch's best trials: {faster}, then {fast}.**")
    assert f"\n\n1. trial {faster}: 8.00x" in note and f"\n\n2. trial {fast}: 4.00x" in note


def test_a_pruned_trial_reads_as_stopped_with_its_reason_in_mlflow(digits_study: Search) -> None:
    slow = trials_by_seed(digits_study)["slow"]
    assert slow.state == optuna.trial.TrialState.PRUNED
    [run] = [r for r in runs_view(digits_study) if r["paretorch.trial"] == str(slow.number)]
    assert run["status"] == "KILLED", "MLflow's status for a run stopped before its end"
    assert run["outcome"].startswith("stopped: by the latency probe: 0.07x")
    assert "feasible" not in run, "never judged against the allowed drop: not infeasible"


def test_a_pruned_record_logs_stopped_and_its_reason_never_infeasible(tmp_path: Path) -> None:
    stopped = TrialRecord(number=3, state=PRUNED, runtime="openvino", configs={},
                          infeasible="stopped by the latency probe: 0.80x [0.78, 0.82] paired after 6 rounds")
    tags = stopped.tracking_tags({"device": "cpu"})
    assert tags["outcome"] == "stopped: by the latency probe: 0.80x [0.78, 0.82] paired after 6 rounds"
    assert "feasible" not in tags
    cannot = TrialRecord(number=4, state=PRUNED, runtime="eager", infeasible="int4_weight_only cannot run on cpu")
    assert cannot.tracking_tags({})["outcome"] == "stopped: int4_weight_only cannot run on cpu"
    assert TrialRecord(number=5, state="COMPLETE", runtime="eager", feasible=True).tracking_tags({})["outcome"] == \
        "complete"
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker.open_study("digits", "study-stopped", params={}, tags={})
    run = MlflowClient(tracking_uri=tracker.uri).get_run(tracker.log_trial(3, PRUNED, {}, {}, tags))
    assert run.info.status == "KILLED" and run.data.tags["outcome"].startswith("stopped: by the latency probe")
    assert "feasible" not in run.data.tags


def test_a_trial_that_leaves_the_front_loses_its_rank(tmp_path: Path) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker.open_study("digits", "study-ranks", params={}, tags={})
    for number in range(3):
        tracker.log_trial(number, "COMPLETE", {}, {}, {})
    tracker.set_trial_ranks(RANK_METRIC, {1: 1, 2: 2})
    tracker.set_trial_ranks(RANK_METRIC, {2: 1})  # a resumed study: trial 1 left the front
    client = MlflowClient(tracking_uri=tracker.uri)
    ranks = {n: client.get_run(tracker.children[n]).data.metrics.get(RANK_METRIC) for n in range(3)}
    assert ranks[0] is None and math.isnan(ranks[1] or 0.0) and ranks[2] == 1.0


def lead(number: int, speedup: float) -> BestTrial:
    return BestTrial(1, ParetoRow(trial=number, metric=0.99, drop=0.0, latency_ms=1 / speedup, speedup=speedup,
                                  size_bytes=math.nan, recipe="int8s | ort", exports=""))


class FakeTrial:
    def __init__(self, number: int, seconds: float, speedup: float) -> None:
        start = datetime(2026, 11, 28, 12, 0, 0)
        self.number = number
        self.state = optuna.trial.TrialState.COMPLETE
        self.datetime_start = start + timedelta(seconds=seconds - 1)
        self.datetime_complete = start + timedelta(seconds=seconds)
        self.user_attrs = {ATTR_FEASIBLE: True, ATTR_METRICS: {"speedup": speedup}}


def test_the_found_line_names_the_fronts_lead_and_says_where_the_curve_reaches_higher() -> None:
    trials = [FakeTrial(0, 1, 1.0), FakeTrial(1, 20, 3.8), FakeTrial(2, 46, 5.63), FakeTrial(4, 60, 4.11)]
    points = best_so_far(trials)  # type: ignore[arg-type]
    assert points == [ResultPoint(1.0, 1.0, 0), ResultPoint(20.0, 3.8, 1), ResultPoint(46.0, 5.63, 2)]
    assert found_line(points, lead(4, 4.11), 60.0, 120.0) == (
        "time to result: the front's lead, trial 4 (4.11x), found after 60 s; 90 % of its speed-up (3.80x, trial 1) "
        "after 20 s; the curve of best point speed-ups reaches 5.63x (trial 2), a trial off the front: tied with or "
        "beaten by a front trial (its MLflow tags say which); the study's trials ran 120 s")
    assert found_line(points[:2], lead(1, 3.8), 20.0, 21.0) == (
        "time to result: the front's lead, trial 1 (3.80x), found after 20 s; the study's trials ran 21 s")
    assert found_line([], None, None, 9.0) == "time to result: no trial on the front in 9 s"


def test_the_pareto_trials_folders_are_printed_best_first() -> None:
    recipes = {1: Path("/s/trial-001/recipe.json"), 4: Path("/s/trial-004/recipe.json")}
    best = [BestTrial(1, lead(4, 4.11).row), BestTrial(2, lead(1, 3.8).row)]
    assert front_files(recipes, best) == ["Pareto trial 4 (best 1 of 2): /s/trial-004/recipe.json",
                                          "Pareto trial 1 (best 2 of 2): /s/trial-001/recipe.json"]
