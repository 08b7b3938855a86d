"""The stage contract, run over every registered stage and a third-party toy stage.

Parametrized over the registry: a new stage is held to these tests with no new test
code. The toy stage (``tests/stages/toy_plugin``) is a separate package installed with
pip into a temporary folder; it is found through its entry point, like the built-ins,
and run through ``python -m paretorch optimize`` (what ``make optimize`` runs).
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
from torch import nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.mirror import ExportMirror, NotMirrored
from paretorch.pipeline.core.runtimes.registry import registered_runtimes
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import (
    ENTRY_POINT_GROUP,
    ExportResult,
    Stage,
    StageConfig,
    StageContext,
    apply_stage,
    config_from_dict,
    registered_stages,
)
from paretorch.pipeline.engine.graph import default_pipeline

CPU = torch.device("cpu")
TOY_STAGE = "toy.scale_bias"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def toy_stage(toy_plugins_loaded: None) -> Stage:
    """The toy stage, registered through its entry point (``toy_plugins_loaded`` in conftest.py)."""
    return registered_stages()[TOY_STAGE]


def _stage_names(exports: bool = True) -> list[str]:
    names = [name for name, stage in sorted(registered_stages().items()) if exports or not stage.is_export]
    return names if TOY_STAGE in names else [*names, TOY_STAGE]  # under --toy-plugin it is registered already


def _stage(request: pytest.FixtureRequest) -> Stage:
    if request.param == TOY_STAGE:
        stage: Stage = request.getfixturevalue("toy_stage")
        return stage
    return registered_stages()[request.param]


@pytest.fixture(params=_stage_names())
def stage(request: pytest.FixtureRequest) -> Stage:
    """Every registered stage, and the toy stage of a separately installed package."""
    return _stage(request)


@pytest.fixture(params=_stage_names(exports=False))
def model_stage(request: pytest.FixtureRequest) -> Stage:
    """Every registered stage that produces a model (exports mirror these), and the toy stage."""
    return _stage(request)


def suggested_configs(stage: Stage, spec: ModelSpec, trials: int = 24) -> list[StageConfig | None]:
    """What ``suggest`` returns for ``trials`` random trials of a throw-away study."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    ctx = StageContext(spec=spec, device=CPU)
    configs = []
    for _ in range(trials):
        configs.append(stage.config_type.suggest(study.ask(), ctx))
    return configs


def example_config(stage: Stage, spec: ModelSpec) -> StageConfig:
    """The first config ``suggest`` returns that runs on this CPU."""
    for config in suggested_configs(stage, spec):
        if config is not None and stage.unavailable(config, StageContext(spec, CPU).capabilities) is None:
            return config
    raise AssertionError(f"stage {stage.name}: suggest never returned a config that runs on the CPU")


# --------------------------------------------------------------------------- the record


def test_every_builtin_stage_is_declared_as_an_entry_point() -> None:
    names = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert {"prune", "distill", "quantize", "amp", "export.coreml", "export.onnx", "export.pt2"} <= names
    assert names <= set(registered_stages())


def test_stage_record_is_consistent(stage: Stage) -> None:
    assert stage.name == stage.config_type.stage
    assert issubclass(stage.config_type, StageConfig)
    assert stage.config_type.model_config.get("frozen") is True
    assert stage.config_type.model_config.get("extra") == "forbid"
    if stage.is_export:
        assert not stage.numeric and stage.mirror is None
    if stage.numeric:
        assert stage.mirror is not None, f"numeric stage {stage.name} must declare its export mirror"


def test_export_mirror_is_declared(model_stage: Stage, digits_spec: ModelSpec) -> None:
    stage = model_stage
    config = example_config(stage, digits_spec)
    mirror = stage.mirror_of(config)
    assert isinstance(mirror, ExportMirror)
    if isinstance(stage.mirror, NotMirrored):
        assert mirror.not_mirrored == (f"{stage.name}: {stage.mirror.reason}",)
    if stage.numeric and not isinstance(stage.mirror, NotMirrored):
        assert mirror != ExportMirror(), f"numeric stage {stage.name}'s mirror says nothing for {config}"


def test_mirror_facts_say_what_they_need_and_name_no_runtime(model_stage: Stage, digits_spec: ModelSpec) -> None:
    """A stage's mirror facts say what a runtime must reproduce, on the declared axes, in words that name no
    runtime (each runtime declares what it reproduces)."""
    runtimes = set(registered_runtimes())
    for config in [example_config(model_stage, digits_spec), *suggested_configs(model_stage, digits_spec)]:
        if config is None:
            continue
        for need in model_stage.mirror_of(config).needs():
            assert need.kind in ("precision", "quantization", "group", "stage", "output") and need.values and need.what
            assert not runtimes & set(need.values), f"{model_stage.name} names a runtime: {need}"


# --------------------------------------------------------------------------- config and suggest


def test_suggest_returns_none_or_a_valid_config(stage: Stage, digits_spec: ModelSpec) -> None:
    configs = suggested_configs(stage, digits_spec)
    assert any(c is not None for c in configs), f"{stage.name}: suggest never turned the stage on"
    for config in configs:
        if config is not None:
            assert type(config) is stage.config_type
            assert stage.config_type.model_validate(config.model_dump()) == config


def test_config_round_trips_through_its_dict_form(stage: Stage, digits_spec: ModelSpec) -> None:
    for config in suggested_configs(stage, digits_spec):
        if config is None:
            continue
        data = json.loads(json.dumps(config.to_dict()))
        assert data["stage"] == stage.name
        assert config_from_dict(data) == config


def test_requires_answers_with_a_reason_or_none(stage: Stage, digits_spec: ModelSpec) -> None:
    caps = StageContext(spec=digits_spec, device=CPU).capabilities
    for config in suggested_configs(stage, digits_spec):
        if config is not None:
            reason = stage.unavailable(config, caps)
            assert reason is None or (isinstance(reason, str) and reason)


# --------------------------------------------------------------------------- apply


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_apply_leaves_its_input_unchanged_and_resolves_to_its_type(
    stage: Stage, digits_spec: ModelSpec, digits_model: nn.Module, tmp_path: Path
) -> None:
    model = copy.deepcopy(digits_model)
    before = _state(model)
    config = example_config(stage, digits_spec)
    ctx = StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path, float_model=copy.deepcopy(model))
    try:
        result = apply_stage(model, config, ctx)
    except InfeasibleConfig as exc:
        pytest.fail(f"{stage.name} with {config.describe()} was infeasible on digits: {exc.reason}")
    after = _state(model)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before), f"{stage.name} changed its input model"
    if stage.is_export:
        assert isinstance(result, ExportResult) and result.path.exists()
    else:
        assert isinstance(result, nn.Module) and result is not model
    assert ctx.resolved_config is None or type(ctx.resolved_config) is stage.config_type


# --------------------------------------------------------------------------- the toy stage, end to end


def test_toy_stage_sits_where_it_says_in_the_default_pipeline(
    toy_stage: Stage, default_stages: tuple[list[str], list[str]]
) -> None:
    """Order 20, as distill: equal orders sort by name, so after distill; before pack (25)."""
    model_stages, exports = default_stages  # the registry's stages by (order, name), the toy's included
    pipeline = default_pipeline()
    assert pipeline.describe() == " -> ".join(["model", *model_stages, "{" + ", ".join(exports) + "}"])
    chain = [n.name for n in pipeline.model_stage_nodes()]
    assert chain.index("prune") < chain.index("distill") < chain.index(TOY_STAGE) < chain.index("pack")
    assert all(pipeline.node(name).inputs == (chain[-1],) for name in exports), "exports read the last model stage"


def test_toy_stage_runs_through_optimize(toy_plugin_site: Path, tmp_path: Path) -> None:
    """``python -m paretorch optimize`` finds the installed toy stage, searches it (on/off and its integer are the
    study's params) and runs it: a recipe with it is enqueued, so the test does not hang on the sampler's draws."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_plugin_site), str(REPO)]),
           "PARETORCH_RESULTS_DIR": str(tmp_path)}
    recipe = tmp_path / "toy-twice.json"
    recipe.write_text(json.dumps({"stages": [{"stage": TOY_STAGE, "repeats": 2}], "runtime": "eager"}))
    run = subprocess.run(
        [sys.executable, "-m", "paretorch", "optimize", "--model", "digits", "--trials", "5", "--no-tracking",
         "--runtimes", "eager", "--latency-budget", "quick", "--exports", "none", "--disable", "prune,distill,amp",
         "--threads", "1", "--enqueue", str(recipe)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    [summary] = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    recipes = [t.user_attrs["paretorch.recipe"] for t in study.trials if "paretorch.recipe" in t.user_attrs]
    toy_runs = [r for r in recipes if any(s["stage"] == TOY_STAGE for s in r["stages"])]
    assert toy_runs, f"no trial ran the toy stage: {[r['stages'] for r in recipes]}"
    assert any(s.get("repeats") == 2 for r in toy_runs for s in r["stages"] if s["stage"] == TOY_STAGE)
    assert any("toy.scale_bias.on" in t.params for t in study.trials), "the search samples it"
    assert all([s["stage"] for s in r["stages"]].index(TOY_STAGE) == 0 for r in toy_runs)
