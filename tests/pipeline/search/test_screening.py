"""Cheap before costly: a costly stage runs at low fidelity first, the full cost only for what can reach the front."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import optuna
import pytest
import torch
from rich.console import Console
from torch import nn

from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, config_from_dict, registered
from paretorch.pipeline.search import Search, SearchConfig, run_search, screening
from paretorch.pipeline.search.objectives import (
    ATTR_CONFIGS,
    ATTR_FEASIBLE,
    ATTR_METRICS,
    ATTR_REASON,
    ATTR_RECIPE,
    ATTR_SEED,
)
from paretorch.pipeline.search.screening import (
    ATTR_SCREEN,
    ATTR_SCREENED_OUT,
    CostlyClock,
    ScreeningPolicy,
    front_points,
    low_fidelity,
    ran_at_full,
    screened_note,
)

#: The work each toy.costly run did (its config's ``work``), in order.
COST: list[int] = []


class CostlyConfig(StageConfig):
    """A test-only costly stage: ``work`` units of cost; ``ruin`` zeroes the model (a prefix that cannot recover)."""

    stage = "toy.costly"
    work: int = 100
    ruin: bool = False

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        return None

    def low_fidelity(self) -> Self | None:
        return type(self).model_validate({**self.model_dump(), "work": self.work // 4})


def apply_costly(model: nn.Module, config: CostlyConfig, ctx: StageContext) -> nn.Module:
    COST.append(config.work)
    if config.ruin:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.zero_()
    return model


@pytest.fixture(scope="module")
def costly_stage() -> Iterator[None]:
    with registered(Stage(CostlyConfig, apply_costly)):
        yield


def test_a_bad_prefix_is_stopped_before_its_full_cost(residual_spec: ModelSpec, costly_stage: None,
                                                       tmp_path: Path) -> None:
    pipeline_file = tmp_path / "costly.yaml"
    pipeline_file.write_text("nodes:\n  - {op: model}\n  - {op: toy.costly}\n  - {op: quantize}\n"
                             "  - {name: evaluate, op: evaluate}\n")
    good = {"stage": "toy.costly", "work": 100}
    config = SearchConfig.load(
        None, pipeline=str(pipeline_file), sampler="random", runtimes=("eager",), latency_budget="quick",
        exports="none", compose=0, seeds=[
            {"name": "good", "stages": [good]},
            {"name": "ruin", "stages": [{**good, "ruin": True}]},
            {"name": "good-int8", "stages": [good, {"stage": "quantize", "method": "int8_dynamic"}]},
        ])
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}",
                    track=False)
    COST.clear()
    trials = {t.user_attrs[ATTR_SEED]: t for t in run_search(search, trials=4).study.trials}
    # good: screened at a quarter of the work, then run in full; ruin: the quarter only; good-int8: its
    # costly prefix already ran in full (cached), so it is neither screened nor run again.
    assert COST == [25, 100, 25]
    assert trials["good"].state.name == "COMPLETE" and trials["good"].user_attrs[ATTR_SCREEN]["passed"] is True
    ruin = trials["ruin"]
    assert ruin.state.name == "PRUNED" and ruin.values is None
    assert ruin.user_attrs[ATTR_SCREEN]["passed"] is False and ruin.user_attrs[ATTR_SCREEN]["lowered"] == "toy.costly"
    assert ruin.user_attrs[ATTR_SCREENED_OUT].startswith("drop ")
    assert ruin.user_attrs[ATTR_REASON].startswith("screened out at low fidelity (toy.costly): drop")
    # not screened (no costly stage): complete, or stopped by the latency probe (int8 under eager, this tiny model)
    good = trials["good-int8"]
    assert good.state.name in ("COMPLETE", "PRUNED") and ATTR_SCREEN not in good.user_attrs
    note = screened_note(list(trials.values()))
    assert note is not None and note.startswith("1 of 2 screened trial(s) screened out")


def test_past_their_share_of_the_time_costly_trials_stop_at_low_fidelity(
    monkeypatch: pytest.MonkeyPatch, residual_spec: ModelSpec, costly_stage: None, tmp_path: Path
) -> None:
    """A share so small that any costly work is over it (and no floor): the first costly trial runs its low
    fidelity and stops there; the next one is stopped before any costly work."""
    monkeypatch.setattr(screening, "COSTLY_FLOOR_S", 0.0)
    pipeline_file = tmp_path / "costly.yaml"
    pipeline_file.write_text("nodes:\n  - {op: model}\n  - {op: toy.costly}\n  - {name: evaluate, op: evaluate}\n")
    config = SearchConfig.load(
        None, pipeline=str(pipeline_file), sampler="random", runtimes=("eager",), latency_budget="quick",
        exports="none", compose=0, costly_share=1e-9, seeds=[
            {"name": "first", "stages": [{"stage": "toy.costly", "work": 100}]},
            {"name": "second", "stages": [{"stage": "toy.costly", "work": 200}]},
        ])
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}",
                    track=False)
    COST.clear()
    console = Console(file=io.StringIO(), width=400)
    trials = {t.user_attrs[ATTR_SEED]: t for t in run_search(search, trials=3, console=console).study.trials}
    assert COST == [25], "the low fidelity of the first only; neither full cost"
    said = console.file.getvalue()  # type: ignore[attr-defined]
    assert said.count("screened out at low fidelity (toy.costly): time cap: costly stages") == 2, said
    first, second = trials["first"], trials["second"]
    assert first.state.name == second.state.name == "PRUNED"
    assert first.user_attrs[ATTR_SCREEN]["drop"] is not None
    assert first.user_attrs[ATTR_SCREENED_OUT].startswith("time cap: costly stages (toy.costly) took ")
    assert first.user_attrs[ATTR_SCREENED_OUT].endswith("; the full cost is not paid")
    assert second.user_attrs[ATTR_SCREEN]["drop"] is None and second.user_attrs[ATTR_SCREENED_OUT].endswith("; not run")
    assert second.user_attrs[ATTR_REASON].startswith("screened out at low fidelity (toy.costly): time cap")
    note = screened_note(list(trials.values()))
    assert note is not None and note.startswith("2 of 2 screened trial(s) screened out at low fidelity before their "
                                                "full cost, 2 of them by the costly stages' time cap")


def test_the_costly_clock_counts_the_lowered_stages_since_it_started() -> None:
    seconds = {"distill": 50.0, "quantize": 5.0, "amp": 500.0}
    now = [1000.0]
    clock = CostlyClock(0.25, lambda: dict(seconds), clock=lambda: now[0], floor=10.0)
    assert CostlyClock(0.25, lambda: {}).floor == screening.COSTLY_FLOOR_S
    now[0] += 100.0
    seconds["amp"] += 90.0  # not a costly stage: never counted
    assert clock.over({"distill"}) is None and clock.spent() == 0.0
    seconds["distill"] += 25.0
    assert clock.over({"distill"}) is None, "25 s of 100 s is the share, not over it"
    seconds["quantize"] += 1.0
    reason = clock.over({"quantize"})
    assert clock.spent() == 26.0
    assert reason == ("time cap: costly stages (distill, quantize) took 26 s of this run's 100 s, over the 25% cap "
                      "(search config costly_share)")
    now[0] += 4.0
    assert clock.over(()) is None, "26 s of 104 s"
    seconds["distill"] += 30.0
    floored = CostlyClock(0.25, lambda: dict(seconds), clock=lambda: now[0], floor=40.0)
    seconds["distill"] += 39.0
    assert floored.over({"distill"}) is None, "under the floor, whatever the share"


def test_only_costly_stages_are_lowered_and_a_lowered_config_is_another_node() -> None:
    distill = config_from_dict({"stage": "distill", "steps": 400, "max_seconds": 300})
    prune = config_from_dict({"stage": "prune", "ratio": 0.3})
    plan = low_fidelity({"prune": prune, "distill": distill, "quantize": None}, export_nodes=())
    assert plan is not None and plan.lowered == ("distill",)
    assert plan.configs["prune"] == prune and plan.configs["quantize"] is None
    assert plan.configs["distill"] != distill and plan.configs["distill"].to_dict()["steps"] == 100
    assert low_fidelity({"prune": prune, "quantize": None}, export_nodes=()) is None


def test_the_margin_is_a_prior_until_recoveries_are_measured() -> None:
    policy = ScreeningPolicy(prior_margin=3.0, safety=1.5, min_history=2)
    assert policy.margin(0.01, []) == pytest.approx(0.03)
    assert policy.margin(0.01, [0.02]) == pytest.approx(0.03), "one recovery is not a history"
    assert policy.margin(0.01, [0.02, 0.004]) == pytest.approx(0.03)
    assert policy.margin(0.01, [0.1, 0.004]) == pytest.approx(0.15)
    assert policy.margin(0.01, [-0.01, -0.02]) == 0.0, "never negative"


def test_a_screen_fails_on_the_drop_or_when_dominated_on_latency() -> None:
    policy = ScreeningPolicy(latency_tolerance=0.1)
    assert policy.reason(0.05, None, allowed=0.01, margin=0.03, front=[]) is not None
    assert policy.reason(0.035, None, allowed=0.01, margin=0.03, front=[]) is None
    front = [(0.0, 1.0)]  # a feasible trial at 1 ms with no drop
    reason = policy.reason(0.035, 2.0, allowed=0.01, margin=0.03, front=front)
    assert reason is not None and reason.startswith("dominated"), "even fully recovered (0.005) it is slower"
    assert policy.reason(0.035, 1.05, allowed=0.01, margin=0.03, front=front) is None, "within the tolerance"
    assert policy.reason(0.035, None, allowed=0.01, margin=0.03, front=front) is None, "latency unknown"
    assert policy.reason(0.02, 2.0, allowed=0.01, margin=0.03, front=[(0.0, 1.0)]) is None, (
        "it might recover below the front's drop")


def test_the_front_is_read_as_the_screen_times_it_alone_and_only_from_feasible_trials() -> None:
    key = "latency_ms_p50_b1"
    paired = optuna.trial.create_trial(values=[0.9, 1.0], user_attrs={
        ATTR_FEASIBLE: True, ATTR_METRICS: {"metric_drop": 0.0, key: 1.0, f"{key}_unpaired": 1.3}})
    plain = optuna.trial.create_trial(values=[0.9, 2.0], user_attrs={
        ATTR_FEASIBLE: True, ATTR_METRICS: {"metric_drop": 0.001, key: 2.0}})
    over = optuna.trial.create_trial(values=[0.5, 0.1], user_attrs={
        ATTR_FEASIBLE: False, ATTR_METRICS: {"metric_drop": 0.4, key: 0.1}})
    assert front_points([paired, plain, over], key) == [(0.0, 1.3), (0.001, 2.0)]


def test_a_prefix_that_ran_in_full_as_asked_or_as_resolved_is_not_screened_again() -> None:
    asked = config_from_dict({"stage": "distill", "steps": 400, "max_seconds": 300})
    resolved = config_from_dict({"stage": "distill", "steps": 400, "stop_step": 51})
    int8 = config_from_dict({"stage": "quantize", "method": "int8_dynamic"})
    ran = optuna.trial.create_trial(values=[0.9, 1.0], user_attrs={
        ATTR_CONFIGS: {"distill": asked.to_dict(), "quantize": None},
        ATTR_RECIPE: {"stages": [resolved.to_dict()], "runtime": "eager"}})
    for configs in ({"distill": asked, "quantize": int8}, {"distill": resolved, "quantize": None}):
        plan = low_fidelity(configs, export_nodes=())
        assert plan is not None and ran_at_full([ran], configs, plan)
    other = {"distill": config_from_dict({"stage": "distill", "steps": 200}), "quantize": int8}
    plan = low_fidelity(other, export_nodes=())
    assert plan is not None and not ran_at_full([ran], other, plan)
