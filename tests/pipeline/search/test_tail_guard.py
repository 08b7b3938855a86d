"""The tail guard in a search: a recipe that breaks a share of the inputs is infeasible with its reason, at full
evaluation and at the low-fidelity screen; every trial shows its per-input view on its line, in the table and in
MLflow, and names its worst inputs (paretorch.pipeline.core.input_agreement)."""

from __future__ import annotations

import inspect
import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Self

import optuna
import pytest
import torch
from mlflow import MlflowClient
from rich.console import Console
from torch import Tensor, nn

from paretorch.pipeline.core.paired import Timed
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, registered
from paretorch.pipeline.search import Search, SearchConfig, run_search
from paretorch.pipeline.search.objectives import ATTR_FEASIBLE, ATTR_METRICS, ATTR_REASON, Baseline, Objectives
from paretorch.pipeline.search.record import ATTR_WORST_INPUTS, WORST_INPUTS_FILE
from paretorch.pipeline.search.screening import ATTR_SCREENED_OUT
from paretorch.pipeline.tracking.tracker import experiment_name
from tests.pipeline.search.conftest import run_on_fake_clock, trials_by_seed

#: Every this-many-th row of a batch flips its (confident) class.
EVERY = 25
#: The work each toy.tail_costly run did, in order.
COST: list[int] = []


class TailConfig(StageConfig):
    """Flips the class of one row in :data:`EVERY` (its logits rolled): ~4 % of the inputs, all confident."""

    stage = "toy.tail"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        return None


class Tailed(nn.Module):
    def __init__(self, model: nn.Module, label: str = "tail") -> None:
        super().__init__()
        self.model = model
        self.paretorch_label = label

    def forward(self, x: Tensor) -> Tensor:
        out = self.model(x)
        rows = torch.arange(out.shape[0], device=out.device) % EVERY == 0
        return torch.where(rows.unsqueeze(1), out.roll(1, dims=-1), out)


def apply_tail(model: nn.Module, config: TailConfig, ctx: StageContext) -> nn.Module:
    return Tailed(model)


class CostlyTailConfig(StageConfig):
    """A costly stage (screened at a quarter of its ``work``) whose model flips a tail of inputs."""

    stage = "toy.tail_costly"
    work: int = 100

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        return None

    def low_fidelity(self) -> Self | None:
        return type(self).model_validate({**self.model_dump(), "work": self.work // 4})


def apply_costly_tail(model: nn.Module, config: CostlyTailConfig, ctx: StageContext) -> nn.Module:
    COST.append(config.work)
    return Tailed(model, "costly")


class LabelTimer:
    """Latency by the model's label: the tailed model 4x faster than the baseline."""

    def warm_up(self, sides: Sequence[Timed]) -> None:
        pass

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        return [{"tail": 0.25, "costly": 0.25}.get(getattr(inspect.unwrap(fn), "paretorch_label", None), 1.0)
                for fn, _ in sides]


@pytest.fixture(scope="module")
def tail_stages() -> Iterator[None]:
    with registered(Stage(TailConfig, apply_tail)), registered(Stage(CostlyTailConfig, apply_costly_tail)):
        yield


def tail_search(spec: ModelSpec, folder: Path, **fields: object) -> Search:
    pipeline_file = folder / "tail.yaml"
    pipeline_file.write_text("nodes:\n  - {op: model}\n  - {op: toy.tail}\n  - {name: evaluate, op: evaluate}\n")
    config = SearchConfig.load(None, pipeline=str(pipeline_file), sampler="random", runtimes=("eager",),
                               latency_budget="quick", exports="none", max_drop="10%", presets=(),
                               seeds=[{"name": "tail", "stages": [{"stage": "toy.tail"}]}], **fields)
    return run_on_fake_clock(spec, config, folder, LabelTimer(), trials=2)


@pytest.fixture(scope="module")
def guarded(digits_spec: ModelSpec, tail_stages: None, tmp_path_factory: pytest.TempPathFactory) -> Search:
    return tail_search(digits_spec, tmp_path_factory.mktemp("guarded"))


def test_a_recipe_that_breaks_a_tail_is_infeasible_with_the_share_in_its_reason(guarded: Search) -> None:
    tail = trials_by_seed(guarded)["tail"]
    metrics = tail.user_attrs[ATTR_METRICS]
    assert metrics["metric_drop"] < 0.1 * metrics["accuracy"], "within the allowed drop: only the tail rules it out"
    assert metrics["inputs_broken_share"] == pytest.approx(metrics["input_flip_share"], abs=0.005)
    assert 0.03 < metrics["inputs_broken_share"] < 0.05
    assert tail.user_attrs[ATTR_FEASIBLE] is False
    share = 100 * metrics["inputs_broken_share"]
    assert tail.user_attrs[ATTR_REASON] == (f"tail: {share:.1f} % of inputs with a confident prediction flipped "
                                            "(tail limit 1 %)")
    best = guarded.outcome.study.best_trials  # type: ignore[attr-defined]
    assert tail.number not in [t.number for t in best], "Optuna's constraint says infeasible too"


def test_every_trial_shows_its_inputs_on_its_line_and_names_its_worst(guarded: Search) -> None:
    output = guarded.output  # type: ignore[attr-defined]
    tail = trials_by_seed(guarded)["tail"]
    line = next(line for line in output.splitlines() if line.startswith(f"trial {tail.number:3d} COMPLETE"))
    share = 100 * tail.user_attrs[ATTR_METRICS]["inputs_broken_share"]
    assert f"| inputs: flips {share:.1f} %, confident {share:.1f} % |" in line, line
    assert f"| infeasible: {tail.user_attrs[ATTR_REASON]} <- tail" in line, "the line says why it is off the front"
    assert "self-check: " in output and "noise floor" not in output, (
        "the study's first lines are printed, and digits (confident on its inputs) is above its noise floor")
    baseline_line = next(line for line in output.splitlines() if line.startswith("trial   0 COMPLETE"))
    assert "| inputs: flips 0.0 %, confident 0.0 % |" in baseline_line
    worst = tail.user_attrs[ATTR_WORST_INPUTS]
    assert worst and all(row["broken"] and row["flip"] == 0.0 for row in worst)
    batch = int(guarded.plan.spec.evaluation()[0][1].shape[0])
    assert all(int(row["index"]) % batch % EVERY == 0 for row in worst), "the planted rows, by their index"


def test_mlflow_holds_the_per_input_view_and_the_worst_inputs_file(guarded: Search) -> None:
    client = MlflowClient(tracking_uri=guarded.store.tracking_uri)
    tail = trials_by_seed(guarded)["tail"]
    experiment = client.get_experiment_by_name(experiment_name(guarded.plan.spec.name))
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id], filter_string=f"tags.`paretorch.trial` = '{tail.number}'")
    metrics = tail.user_attrs[ATTR_METRICS]
    assert run.data.metrics["inputs_broken_share"] == pytest.approx(metrics["inputs_broken_share"])
    assert run.data.metrics["input_flip_share"] == pytest.approx(metrics["input_flip_share"])
    assert run.data.tags["reason"].startswith("tail: ") and run.data.tags["feasible"] == "false"
    path = client.download_artifacts(run.info.run_id, WORST_INPUTS_FILE)
    assert json.loads(Path(path).read_text()) == tail.user_attrs[ATTR_WORST_INPUTS]


def test_the_guard_can_be_turned_off(digits_spec: ModelSpec, tail_stages: None, tmp_path: Path) -> None:
    search = tail_search(digits_spec, tmp_path, tail_limit="off")
    tail = trials_by_seed(search)["tail"]
    assert tail.user_attrs[ATTR_FEASIBLE] is True
    assert "inputs_broken_share" in tail.user_attrs[ATTR_METRICS], "still shown, not judged"


def test_a_planted_tail_is_stopped_at_the_screen_before_its_full_cost(digits_spec: ModelSpec, tail_stages: None,
                                                                      tmp_path: Path) -> None:
    pipeline_file = tmp_path / "costly.yaml"
    pipeline_file.write_text("nodes:\n  - {op: model}\n  - {op: toy.tail_costly}\n  - {name: evaluate, op: evaluate}\n")
    config = SearchConfig.load(None, pipeline=str(pipeline_file), sampler="random", runtimes=("eager",),
                               latency_budget="quick", exports="none", max_drop="10%", presets=(), compose=0,
                               seeds=[{"name": "costly", "stages": [{"stage": "toy.tail_costly", "work": 100}]}])
    search = Search(digits_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}", track=False)
    search.model.latency.timer = LabelTimer()
    search.model.latency.cpu_clock = None
    COST.clear()
    trials = {t.user_attrs.get("paretorch.seed"): t for t in
              run_search(search, trials=2, console=Console(file=io.StringIO(), width=300)).study.trials}
    costly = trials["costly"]
    assert COST == [25], "the low fidelity only: its full cost never paid"
    assert costly.state == optuna.trial.TrialState.PRUNED
    assert costly.user_attrs[ATTR_SCREENED_OUT].startswith("tail: 4.")
    assert "2x it at low fidelity" in costly.user_attrs[ATTR_SCREENED_OUT]


def test_judge_reads_the_tail_beside_the_floors(digits_spec: ModelSpec) -> None:
    objectives = Objectives.create(digits_spec, ["metric", "latency"], "1%")
    baseline = Baseline(0.99, 1.0, 1.0)
    broken = objectives.judge(baseline, 0.99, extras={"input_flip_share": 0.03, "inputs_broken_share": 0.03})
    assert not broken.feasible and broken.reason is not None and broken.reason.startswith("tail: 3.0 % of inputs")
    assert broken.constraint > 0
    kept = objectives.judge(baseline, 0.99, extras={"input_flip_share": 0.03, "inputs_broken_share": 0.0})
    assert kept.feasible
