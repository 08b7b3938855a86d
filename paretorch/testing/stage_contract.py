"""The stage contract (:class:`StageContract`): what every stage, built-in or a plugin's, does."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import ClassVar

import optuna
import pytest
import torch
from torch import nn

from paretorch.extend import (
    STAGES_ENTRY_POINT_GROUP,
    ExportMirror,
    ExportResult,
    InfeasibleConfig,
    ModelSpec,
    NotMirrored,
    Stage,
    StageConfig,
    StageContext,
    apply_stage,
    config_from_dict,
)
from paretorch.pipeline.core.runtimes.registry import registered_runtimes
from paretorch.pipeline.core.stage import registered_stages
from paretorch.testing.digits import OnDigits
from paretorch.testing.under_test import under_test

CPU = torch.device("cpu")
#: How many random trials of a throw-away study ``suggest`` is asked for.
TRIALS = 24
#: The axes a mirror fact's need is on (:class:`paretorch.extend.Need`).
NEED_KINDS = ("precision", "quantization", "group", "stage", "output")
NO_MIRROR = "an export stage declares no mirror: it reproduces the model stages' mirrors"


def suggested_configs(stage: Stage[StageConfig], spec: ModelSpec, trials: int = TRIALS) -> list[StageConfig | None]:
    """What ``suggest`` returns for ``trials`` random trials of a throw-away study."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    ctx = StageContext(spec=spec, device=CPU)
    return [stage.config_type.suggest(study.ask(), ctx) for _ in range(trials)]


def example_config(stage: Stage[StageConfig], spec: ModelSpec) -> StageConfig:
    """The first config ``suggest`` returns that runs on this CPU."""
    caps = StageContext(spec, CPU).capabilities
    for config in suggested_configs(stage, spec):
        if config is not None and stage.unavailable(config, caps) is None:
            return config
    raise AssertionError(f"stage {stage.name}: suggest never returned a config that runs on the CPU")


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class StageContract(OnDigits):
    """The stage contract as a pytest test class: subclass it in the plugin's tests, naming the stage (its
    entry-point name), and pytest runs every check on it, on the CPU, over the digits model
    (:class:`~paretorch.testing.digits.OnDigits`: override ``spec`` and ``model`` for another)::

        from paretorch.testing import StageContract

        class TestScaleBias(StageContract):
            stage_name = "toy.scale_bias"

    The checks: the record is consistent (frozen config, ``extra="forbid"``, a numeric stage declares its
    mirror), ``suggest`` returns None or a valid config of the stage's type, every config round-trips through
    its dict form, ``requires`` answers a reason or None, ``apply`` leaves its input unchanged and returns a new
    model (or an export's file) and a resolved config of its own type, and a model stage's mirror facts say what
    a runtime must reproduce in words that name no runtime.
    """

    #: The stage's name: its entry point's in the ``paretorch.stages`` group.
    stage_name: ClassVar[str]

    @pytest.fixture
    def stage(self) -> Stage[StageConfig]:
        """The stage ``stage_name`` names, found through the installed entry points."""
        return under_test(self, "stage_name", "stage", registered_stages(), STAGES_ENTRY_POINT_GROUP)

    def test_stage_record_is_consistent(self, stage: Stage[StageConfig]) -> None:
        assert stage.name == stage.config_type.stage
        assert issubclass(stage.config_type, StageConfig)
        assert stage.config_type.model_config.get("frozen") is True
        assert stage.config_type.model_config.get("extra") == "forbid"
        if stage.is_export:
            assert not stage.numeric and stage.mirror is None
        if stage.numeric:
            assert stage.mirror is not None, f"numeric stage {stage.name} must declare its export mirror"

    def test_export_mirror_is_declared(self, stage: Stage[StageConfig], spec: ModelSpec) -> None:
        if stage.is_export:
            pytest.skip(NO_MIRROR)
        config = example_config(stage, spec)
        mirror = stage.mirror_of(config)
        assert isinstance(mirror, ExportMirror)
        if isinstance(stage.mirror, NotMirrored):
            assert mirror.not_mirrored == (f"{stage.name}: {stage.mirror.reason}",)
        if stage.numeric and not isinstance(stage.mirror, NotMirrored):
            assert mirror != ExportMirror(), f"numeric stage {stage.name}'s mirror says nothing for {config}"

    def test_mirror_facts_say_what_they_need_and_name_no_runtime(self, stage: Stage[StageConfig],
                                                                spec: ModelSpec) -> None:
        """A stage's mirror facts say what a runtime must reproduce, on the declared axes, in words that name no
        runtime (each runtime declares what it reproduces)."""
        if stage.is_export:
            pytest.skip(NO_MIRROR)
        runtimes = set(registered_runtimes())
        for config in [example_config(stage, spec), *suggested_configs(stage, spec)]:
            if config is None:
                continue
            for need in stage.mirror_of(config).needs():
                assert need.kind in NEED_KINDS and need.values and need.what
                assert not runtimes & set(need.values), f"{stage.name} names a runtime: {need}"

    def test_suggest_returns_none_or_a_valid_config(self, stage: Stage[StageConfig], spec: ModelSpec) -> None:
        configs = suggested_configs(stage, spec)
        assert any(c is not None for c in configs), f"{stage.name}: suggest never turned the stage on"
        for config in configs:
            if config is not None:
                assert type(config) is stage.config_type
                assert stage.config_type.model_validate(config.model_dump()) == config

    def test_config_round_trips_through_its_dict_form(self, stage: Stage[StageConfig], spec: ModelSpec) -> None:
        for config in suggested_configs(stage, spec):
            if config is None:
                continue
            data = json.loads(json.dumps(config.to_dict()))
            assert data["stage"] == stage.name
            assert config_from_dict(data) == config

    def test_requires_answers_with_a_reason_or_none(self, stage: Stage[StageConfig], spec: ModelSpec) -> None:
        caps = StageContext(spec=spec, device=CPU).capabilities
        for config in suggested_configs(stage, spec):
            if config is not None:
                reason = stage.unavailable(config, caps)
                assert reason is None or (isinstance(reason, str) and reason)

    def test_apply_leaves_its_input_unchanged_and_resolves_to_its_type(
        self, stage: Stage[StageConfig], spec: ModelSpec, model: nn.Module, tmp_path: Path
    ) -> None:
        model = copy.deepcopy(model)
        before = _state(model)
        config = example_config(stage, spec)
        ctx = StageContext(spec=spec, device=CPU, output_dir=tmp_path, float_model=copy.deepcopy(model))
        try:
            result = apply_stage(model, config, ctx)
        except InfeasibleConfig as exc:
            pytest.fail(f"{stage.name} with {config.describe()} was infeasible on {spec.name}: {exc.reason}")
        after = _state(model)
        assert before.keys() == after.keys()
        assert all(torch.equal(before[k], after[k]) for k in before), f"{stage.name} changed its input model"
        if stage.is_export:
            assert isinstance(result, ExportResult) and result.path.exists()
        else:
            assert isinstance(result, nn.Module) and result is not model
        assert ctx.resolved_config is None or type(ctx.resolved_config) is stage.config_type
