"""The short recipe notation: what ran, in the fewest characters, for the console and run names."""

from __future__ import annotations

from typing import Self

import optuna
from pydantic import Field
from torch import nn

from paretorch.pipeline.core.runtimes.eager import Eager
from paretorch.pipeline.core.runtimes.registry import registered_runtime
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, config_from_dict, registered
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.short_recipe import short_recipe


def configs(*raw: dict[str, object]) -> list[StageConfig]:
    return [config_from_dict(dict(item)) for item in raw]


def test_the_headline_recipe_reads_in_a_third_of_a_line() -> None:
    stages = configs({"stage": "prune", "ratio": 0.3}, {"stage": "distill", "max_seconds": 300},
                     {"stage": "quantize", "method": "int8_static_pt2e"}, {"stage": "export.onnx"})
    assert short_recipe(stages, "onnxruntime") == "prune 0.3 + distill 200 + int8s | ort"
    assert short_recipe([], "eager") == "baseline | eager"
    assert short_recipe([None, *configs({"stage": "pack"})], "openvino") == "pack | ov", "off stages are skipped"


def test_a_distillation_shows_the_steps_that_ran_not_its_time_budget() -> None:
    cut = configs({"stage": "distill", "steps": 400, "max_seconds": None, "stop_step": 137})
    assert short_recipe(cut, "eager") == "distill 137 | eager"
    assert short_recipe(configs({"stage": "distill", "steps": 100, "max_seconds": 300}), "eager") == \
        "distill 100 | eager"


def test_each_method_and_amount_is_kept() -> None:
    cases = {
        "prune depth 0.25": {"stage": "prune", "method": "depth", "ratio": 0.25},
        "prune sparse 0.5": {"stage": "prune", "method": "unstructured", "ratio": 0.5},
        "prune heads 0.25": {"stage": "prune", "ratio": 0.25, "ffn_ratio": 0.0},
        "prune ffn 0.4": {"stage": "prune", "ratio": 0.25, "head_ratio": 0.0, "ffn_ratio": 0.4},
        "prune 0.34 heads 0.1": {"stage": "prune", "ratio": 0.3417, "head_ratio": 0.1},
        "int8d": {"stage": "quantize", "method": "int8_dynamic"},
        "fp8w": {"stage": "quantize", "method": "float8_weight_only"},
        "intxw g32 asym (2 float)": {"stage": "quantize", "method": "intx_weight_only", "group_size": 32,
                                     "mapping": "asymmetric", "float_layers": ["a", "b"]},
        "bf16": {"stage": "amp", "dtype": "bfloat16", "fp32_layers": []},
        "fp16 (3 fp32)": {"stage": "amp", "dtype": "float16", "fp32_layers": ["a", "b", "c"]},
    }
    for expected, raw in cases.items():
        assert short_recipe(configs(raw), "compile_cudagraphs") == f"{expected} | cudagraphs"


class WidgetConfig(StageConfig):
    stage = "toy.widget"
    size: int = Field(ge=1)
    scale: float = 1.0

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        return None


def _identity(model: nn.Module, config: WidgetConfig, ctx: StageContext) -> nn.Module:
    return model


def test_a_plugin_stage_shows_its_name_and_required_values() -> None:
    with registered(Stage(WidgetConfig, _identity)):
        recipe = Recipe(stages=(WidgetConfig(size=3, scale=2.0),), runtime="compile")
        assert short_recipe(recipe.stages, recipe.runtime) == "toy.widget 3 | compile"


def test_an_empty_list_has_one_spelling() -> None:
    recipe = Recipe(stages=tuple(configs({"stage": "amp", "dtype": "bfloat16", "fp32_layers": []})), runtime="eager")
    assert recipe.describe(brief=True) == recipe.describe() == "amp(dtype=bfloat16, fp32_layers=[]) | eager"
    full = Recipe(stages=tuple(configs({"stage": "amp", "dtype": "bfloat16", "fp32_layers": ["a", "b"]})))
    assert "fp32_layers=[2 items]" in full.describe(brief=True)


def test_a_plugin_stage_and_runtime_write_their_own_short_forms() -> None:
    class Pinned(Eager):  # eager's behaviour under a plugin's name and label
        name = "toy.pinned"
        short_label = "pin"

    def widget(config: WidgetConfig) -> str:
        return f"w{config.size}x{config.scale:g}"

    with registered(Stage(WidgetConfig, _identity, short=widget)), registered_runtime(Pinned()):
        assert short_recipe([WidgetConfig(size=3, scale=2.0)], "toy.pinned") == "w3x2 | pin"
    assert short_recipe([], "toy.not-installed") == "baseline | toy.not-installed", "a stored trial's runtime"
