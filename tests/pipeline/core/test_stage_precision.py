"""The machine probe judges a chain by the precision its stages declare (``Stage.precision``), not by their names."""

from __future__ import annotations

from typing import Literal, Self

import optuna
from torch import nn

from paretorch.pipeline.core.machine_probe import stage_precision
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, registered


class CastConfig(StageConfig):
    stage = "toy.cast"
    to: Literal["bf16", "fp16", "int4", "fp32"] = "bf16"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        return None


def unchanged(model: nn.Module, config: CastConfig, ctx: StageContext) -> nn.Module:
    return model


def cast_precision(config: CastConfig) -> str | None:
    return None if config.to == "fp32" else config.to


def test_a_plugin_stage_is_judged_by_the_precision_it_declares() -> None:
    with registered(Stage(CastConfig, unchanged, precision=cast_precision)):
        assert stage_precision(({"stage": "toy.cast", "to": "fp16"},)) == "fp16"
        assert stage_precision(({"stage": "toy.cast", "to": "int4"},)) == "other", "a precision the probe does not time"
        assert stage_precision(({"stage": "toy.cast", "to": "fp32"},)) == "fp32"
        assert stage_precision(({"stage": "quantize", "method": "int8_dynamic"},
                                {"stage": "toy.cast", "to": "bf16"})) == "int8", "a quantization decides"


def test_a_stage_without_a_declaration_or_not_installed_lowers_nothing() -> None:
    with registered(Stage(CastConfig, unchanged)):
        assert stage_precision(({"stage": "toy.cast", "to": "bf16"},)) == "fp32"
    assert stage_precision(({"stage": "toy.not-installed", "dtype": "bfloat16"},)) == "fp32"


def test_the_built_in_stages_declare_theirs() -> None:
    assert stage_precision(({"stage": "amp", "dtype": "auto"},)) == "fp32", "auto: the device decides when it runs"
    assert stage_precision(({"stage": "amp", "dtype": "float16"}, {"stage": "quantize",
                                                                    "method": "float8_weight_only"})) == "other"
    assert stage_precision(({"stage": "quantize", "method": "int8_static_pt2e"},)) == "int8"
