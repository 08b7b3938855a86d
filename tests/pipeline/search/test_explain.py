"""Repeats, dominance and seed params, without running a model."""

from __future__ import annotations

import optuna
import pytest
import torch
from optuna.study import StudyDirection
from optuna.trial import TrialState

from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import StageContext, config_from_dict, get_stage
from paretorch.pipeline.search.duplicates import RepeatIndex, TrialBudget, recipe_key
from paretorch.pipeline.search.front_rule import dominated_by, dominates, front_tags
from paretorch.pipeline.search.objectives import ATTR_REPEAT_OF
from paretorch.pipeline.search.seeding import stage_params

MAX, MIN = StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE


def test_dominance_follows_each_direction() -> None:
    assert dominates([0.9, 1.0], [0.8, 2.0], [MAX, MIN])
    assert not dominates([0.9, 1.0], [0.9, 1.0], [MAX, MIN]), "equal is not better"
    assert not dominates([0.9, 3.0], [0.8, 2.0], [MAX, MIN])
    assert dominates([0.8, 1.0], [0.9, 2.0], [MIN, MIN])


def test_off_front_trials_name_the_front_trial_that_dominates_them() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    for values in ([0.95, 2.0], [0.90, 1.0], [0.90, 3.0], [0.99, 0.5]):
        study.add_trial(optuna.trial.create_trial(values=values, state=TrialState.COMPLETE))
    front = list(study.best_trials)
    assert {t.number for t in front} == {3}
    dominated = dominated_by(study, front)
    assert dominated == {0: 3, 1: 3, 2: 3}
    tags = front_tags(study, [(front[0], [])], dominated)
    assert tags[3] == {"pareto": "true"} and tags[2] == {"pareto": "false", "dominated_by": "3"}


def test_repeat_keys_ignore_off_stages_and_the_budget_skips_repeats() -> None:
    prune = config_from_dict({"stage": "prune", "ratio": 0.3})
    assert recipe_key([prune, None], "eager") == recipe_key([None, prune], "eager")
    assert recipe_key([prune], "eager") != recipe_key([prune], "compile")
    index = RepeatIndex()
    index.add(4, [recipe_key([prune], "eager"), None])
    index.add(7, [recipe_key([prune], "eager")])
    assert index.find(recipe_key([prune], "eager")) == 4

    study = optuna.create_study()
    budget = TrialBudget(2, (TrialState.COMPLETE, TrialState.PRUNED))
    study.add_trial(optuna.trial.create_trial(value=1.0))
    study.add_trial(optuna.trial.create_trial(state=TrialState.PRUNED, user_attrs={ATTR_REPEAT_OF: 0}))
    assert budget.counted(study) == 1
    study.add_trial(optuna.trial.create_trial(value=2.0))
    assert budget.counted(study) == 2


@pytest.mark.parametrize("raw", [
    None,
    {"stage": "prune", "method": "unstructured", "ratio": 0.3},
    {"stage": "prune", "method": "structured", "ratio": 0.5, "importance": "l1", "scope": "global"},
])
def test_seed_params_reproduce_the_prune_config(residual_spec: ModelSpec, raw: dict[str, object] | None) -> None:
    stage = get_stage("prune")
    config = config_from_dict(raw) if raw else None
    ctx = StageContext(spec=residual_spec, device=torch.device("cpu"))
    params = stage_params(stage.config_type, "prune", config, ctx)
    assert params is not None
    replayed = stage.config_type.suggest(optuna.trial.FixedTrial(params), ctx)
    assert (replayed.to_dict() if replayed else None) == (config.to_dict() if config else None)


def test_seed_params_give_up_on_a_config_suggest_cannot_produce(residual_spec: ModelSpec) -> None:
    config = config_from_dict({"stage": "prune", "ratio": 0.85})  # outside the searched 0.1..0.7
    ctx = StageContext(spec=residual_spec, device=torch.device("cpu"))
    assert stage_params(get_stage("prune").config_type, "prune", config, ctx) is None
