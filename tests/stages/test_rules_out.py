"""Each stage's facts about the unoptimized model and what they rule out, read before any trial runs;
``suggest`` offers only what they leave (PT2E static int8 stays reachable for a CNN on a CPU)."""

from __future__ import annotations

import optuna
import pytest
import torch
from torch import Tensor, nn

from paretorch.pipeline.core.device import Capabilities
from paretorch.pipeline.core.model_facts import ModelFacts
from paretorch.pipeline.core.spec import ACCURACY, ModelSpec
from paretorch.pipeline.core.stage import StageContext, config_from_dict, get_stage
from paretorch.pipeline.search.rule_out import RuleOut
from paretorch.stages.amp.stage import AmpConfig
from paretorch.stages.distill.stage import DistillConfig
from paretorch.stages.prune.stage import PruneConfig
from paretorch.stages.quantize.methods import methods_on
from paretorch.stages.quantize.stage import QuantizeConfig

CPU = torch.device("cpu")
TORCHAO_METHODS = ("int8_weight_only", "int8_dynamic", "intx_weight_only", "float8_weight_only")


class ConvHead(nn.Module):
    """EfficientNet's shape in small: convolutions, pooled, one Linear (the head)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Blocks(nn.Module):
    """Two residual blocks in a ModuleList: what depth pruning removes."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(width), Block(width)])
        self.head = nn.Linear(width, 4)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def spec_of(model: nn.Module, shape: tuple[int, ...]) -> ModelSpec:
    data = torch.randn(8, *shape, generator=torch.Generator().manual_seed(0))
    return ModelSpec(name=type(model).__name__.lower(), build=lambda: model,
                     example_inputs=lambda batch: (data[:batch].clone(),), calibration=lambda: [(data[:4],)],
                     evaluation=lambda: [((data[4:],), torch.zeros(4, dtype=torch.long))], metric=ACCURACY)


def rules_for(model: nn.Module, shape: tuple[int, ...]) -> RuleOut:
    stages = [get_stage(name) for name in ("prune", "distill", "quantize", "amp")]
    return RuleOut.read(model.eval(), spec_of(model, shape), CPU, stages)


def suggested(config_type: type, facts: ModelFacts, spec: ModelSpec, **params: object) -> optuna.trial.FrozenTrial:
    """One trial of ``config_type.suggest`` with the model's facts, its params fixed where given."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial(params)
    trial = study.ask()
    config_type.suggest(trial, StageContext(spec=spec, device=CPU, facts=facts))
    study.tell(trial, 0.0)
    return study.trials[-1]


def test_torchao_methods_touch_no_layer_of_a_cnn_whose_only_linear_is_its_head() -> None:
    rules = rules_for(ConvHead(), (3, 8, 8))
    for name in TORCHAO_METHODS:
        reason = rules.reason([QuantizeConfig(method=name)])
        assert reason is not None and reason.startswith(f"quantize: {name} touches no layer of this model")
        assert "head: the output layer (skip_head)" in reason
    assert rules.reason([QuantizeConfig(method="int8_static_pt2e")]) is None
    assert rules.reason([QuantizeConfig(method="int8_weight_only", skip_head=False, min_weight_elements=0)]) is None


def test_pt2e_static_int8_is_what_the_sampler_offers_a_cnn_on_a_cpu() -> None:
    model = ConvHead()
    rules = rules_for(model, (3, 8, 8))
    assert "int8_static_pt2e" in methods_on(rules.caps)
    trial = suggested(QuantizeConfig, rules.facts, spec_of(model, (3, 8, 8)))
    assert trial.distributions["quantize.method"].choices == ("none", "int8_static_pt2e")
    chosen = suggested(QuantizeConfig, rules.facts, spec_of(model, (3, 8, 8)),
                       **{"quantize.method": "int8_static_pt2e"})
    assert chosen.params["quantize.method"] == "int8_static_pt2e"


def test_a_fallback_over_the_one_layer_a_method_touches_is_ruled_out_and_not_offered(residual_spec: ModelSpec) -> None:
    model = ConvHead()
    spec = spec_of(model, (3, 8, 8))
    rules = rules_for(model, (3, 8, 8))
    reason = rules.reason([QuantizeConfig(method="int8_static_pt2e", fallback_budget=0.01)])
    assert reason is not None and "touches one layer of this model (features.2)" in reason
    trial = suggested(QuantizeConfig, rules.facts, spec, **{"quantize.method": "int8_static_pt2e"})
    assert "quantize.fallback" not in trial.params
    several = rules_for(residual_spec.build(), (16,))  # four block Linear layers pass the filter
    assert several.reason([QuantizeConfig(method="int8_weight_only", fallback_budget=0.01)]) is None


def test_float_layers_that_keep_every_touched_layer_float_are_ruled_out(residual_spec: ModelSpec) -> None:
    rules = rules_for(residual_spec.build(), (16,))
    every = ("block1.0", "block1.2", "block2.0", "block2.2")
    reason = rules.reason([QuantizeConfig(method="int8_weight_only", float_layers=every)])
    assert reason is not None and "keeps every layer it touches in float" in reason
    assert rules.reason([QuantizeConfig(method="int8_weight_only", float_layers=every[:3])]) is None


def test_depth_pruning_is_ruled_out_without_a_removable_block_and_offered_with_one(residual_spec: ModelSpec) -> None:
    flat = rules_for(residual_spec.build(), (16,))  # its blocks are no ModuleList / Sequential elements
    reason = flat.reason([PruneConfig(method="depth", ratio=0.5)])
    assert reason is not None and reason.startswith("prune: depth pruning finds no removable block")
    assert flat.reason([PruneConfig(method="structured", ratio=0.5)]) is None
    trial = suggested(PruneConfig, flat.facts, residual_spec, **{"prune.enabled": True})
    assert trial.distributions["prune.method"].choices == ("structured", "unstructured")
    blocks = rules_for(Blocks(), (32,))
    assert blocks.facts.of("prune").removable_blocks == ("blocks.0", "blocks.1")
    assert blocks.reason([PruneConfig(method="depth", ratio=0.5)]) is None
    offered = suggested(PruneConfig, blocks.facts, spec_of(Blocks(), (32,)), **{"prune.enabled": True})
    assert "depth" in offered.distributions["prune.method"].choices


@pytest.mark.parametrize(("stage", "raw", "why"), [
    ("amp", {"stage": "amp", "dtype": "bfloat16"}, "register_forward_hook is not supported on ScriptModules"),
    ("distill", {"stage": "distill", "steps": 10}, "requires_grad_ is not supported on ScriptModules"),
    ("prune", {"stage": "prune", "ratio": 0.3}, "pruning cannot rewrite"),
    ("quantize", {"stage": "quantize", "method": "int8_static_pt2e"}, "quantization cannot rewrite"),
])
def test_a_torchscript_model_rules_out_the_stages_that_cannot_act_on_it(stage: str, raw: dict[str, object],
                                                                        why: str) -> None:
    rules = rules_for(torch.jit.script(ConvHead().eval()), (3, 8, 8))
    reason = rules.reason([config_from_dict(raw)])
    assert reason is not None and reason.startswith(f"{stage}: the model is TorchScript") and why in reason
    assert "give the Python model" in reason


def test_suggest_offers_no_stage_a_torchscript_model_rules_out() -> None:
    scripted = torch.jit.script(ConvHead().eval())
    rules = rules_for(scripted, (3, 8, 8))
    spec = spec_of(scripted, (3, 8, 8))
    ctx = StageContext(spec=spec, device=CPU, facts=rules.facts)
    trial = optuna.create_study().ask()
    assert AmpConfig.suggest(trial, ctx) is None and PruneConfig.suggest(trial, ctx) is None
    assert DistillConfig.suggest(trial, ctx) is None
    assert QuantizeConfig.suggest(trial, ctx) is None
    assert trial.params == {"quantize.method": "none"}, "no prune, distill or amp param is even asked"


def test_a_study_that_fixed_a_params_choices_keeps_them() -> None:
    """Optuna cannot change a categorical's choices within a study: a study begun before the facts
    existed keeps its full list (a ruled-out choice is then answered before it runs)."""
    model = ConvHead()
    spec = spec_of(model, (3, 8, 8))
    rules = rules_for(model, (3, 8, 8))
    before = ("none", *methods_on(rules.caps))
    ctx = StageContext(spec=spec, device=CPU, facts=rules.facts, study_choices={"quantize.method": before})
    assert ctx.offered("quantize.method", ["none", "int8_weight_only"], lambda _: "ruled out") == list(before)
    assert StageContext(spec=spec, device=CPU).offered("x", [1, 2], lambda _: "ruled out") == [1, 2], "no facts"


def test_a_precision_the_device_table_calls_slow_is_ruled_out() -> None:
    fast_bf16 = Capabilities(kind="cpu", reduced_dtypes=(torch.bfloat16, torch.float16), fast_dtypes=(torch.bfloat16,))
    rules = RuleOut(ModelFacts(scripted=False), fast_bf16)
    assert rules.reason([AmpConfig(dtype="float16")]) == (
        "amp: float16 is not faster than float32 on cpu (no fast reduced dtype)")
    assert rules.reason([AmpConfig(dtype="bfloat16")]) is None
