"""The quantize stage: config validation, every CPU method on the digits CNN and the
residual MLP, the layer filter, the PT2E graph, infeasible methods, suggest()."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from paretorch.pipeline.core.device import capabilities
from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig
from paretorch.pipeline.core.evaluate import compute_metric, serialized_size_bytes
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply, config_from_dict
from paretorch.stages.pack.stage import PackConfig
from paretorch.stages.quantize import stage as quantize_stage
from paretorch.stages.quantize.layers import LayerSelection
from paretorch.stages.quantize.methods import METHODS, methods_on
from paretorch.stages.quantize.stage import QuantizeConfig

CPU = torch.device("cpu")
CPU_METHODS = methods_on(capabilities(CPU))
CPU_DISALLOWED = sorted(set(METHODS) - set(CPU_METHODS))
#: Allowed accuracy drop vs the float model. Measured on this CPU: every CPU method kept the
#: digits accuracy at 0.9924 (the float value) and the residual MLP at its float accuracy.
ACCURACY_FLOOR = 0.02


def _ctx(spec: ModelSpec) -> StageContext:
    return StageContext(spec=spec, device=CPU)


def _accuracy(model: nn.Module, spec: ModelSpec) -> float:
    return compute_metric(model, spec.evaluation(), spec.metric, CPU)


def _quantized_linears(model: nn.Module) -> set[str]:
    from torchao.utils import TorchAOBaseTensor

    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and isinstance(module.weight, TorchAOBaseTensor)
    }


@pytest.fixture(scope="module")
def digits_float_accuracy(digits_model: nn.Module, digits_spec: ModelSpec) -> float:
    return _accuracy(digits_model, digits_spec)


@pytest.fixture(scope="module")
def digits_pt2e(digits_model: nn.Module, digits_spec: ModelSpec) -> tuple[nn.Module, StageContext]:
    """The digits CNN through int8_static_pt2e, once for the module (the flow takes seconds)."""
    ctx = _ctx(digits_spec)
    return apply(digits_model, QuantizeConfig(method="int8_static_pt2e"), ctx), ctx


@pytest.fixture(scope="module")
def residual_model(residual_spec: ModelSpec) -> nn.Module:
    return residual_spec.build()


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "config",
    [
        QuantizeConfig(method="int8_dynamic"),
        QuantizeConfig(method="intx_weight_only", group_size=32, mapping="asymmetric", min_weight_elements=0),
        QuantizeConfig(method="int8_static_pt2e", skip_head=False),
    ],
)
def test_json_round_trip(config: QuantizeConfig) -> None:
    data = json.loads(json.dumps(config.to_dict()))
    assert data["stage"] == "quantize"
    assert config_from_dict(data) == config


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"method": "int3_magic"}, r"method='int3_magic'"),
        ({"method": "int8_dynamic", "group_size": 100}, r"group_size=100"),
        ({"method": "int8_dynamic", "min_weight_elements": -1}, r"min_weight_elements=-1.*greater than or equal to 0"),
        ({"method": "int8_dynamic", "mapping": "affine"}, r"mapping='affine'"),
        (
            {"method": "int8_weight_only", "mapping": "asymmetric"},
            r"mapping='asymmetric' is not supported by method='int8_weight_only'",
        ),
        (
            {"method": "int8_static_pt2e", "mapping": "asymmetric"},
            r"mapping='asymmetric' is not supported by method='int8_static_pt2e'",
        ),
        ({"method": "int8_dynamic", "bits": 4}, r"bits=4: Extra inputs are not permitted"),
    ],
)
def test_invalid_values_name_field_and_value(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"stage": "quantize", **fields})


def test_validation_error_on_direct_construction() -> None:
    with pytest.raises(ValidationError, match="group_size"):
        QuantizeConfig(method="intx_weight_only", group_size=48)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- apply


def test_apply_leaves_input_untouched(digits_model: nn.Module, digits_spec: ModelSpec) -> None:
    before = {k: v.clone() for k, v in digits_model.state_dict().items()}
    quantized = apply(digits_model, QuantizeConfig(method="int8_weight_only"), _ctx(digits_spec))
    assert _quantized_linears(quantized) == {"classifier.1"}
    assert _quantized_linears(digits_model) == set()
    after = digits_model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("method", CPU_METHODS)
def test_cpu_methods_keep_digits_accuracy(
    method: str,
    digits_model: nn.Module,
    digits_spec: ModelSpec,
    digits_float_accuracy: float,
    request: pytest.FixtureRequest,
) -> None:
    if method == "int8_static_pt2e":
        quantized, ctx = request.getfixturevalue("digits_pt2e")
    else:
        ctx = _ctx(digits_spec)
        quantized = apply(digits_model, QuantizeConfig(method=method), ctx)
    accuracy = _accuracy(quantized, digits_spec)
    assert accuracy >= digits_float_accuracy - ACCURACY_FLOOR, f"{method}: {accuracy} vs float {digits_float_accuracy}"
    assert ctx.records["quantize.layers"], method
    assert "classifier.3" not in ctx.records["quantize.layers"]


@pytest.mark.parametrize("method", CPU_METHODS)
def test_cpu_methods_run_on_residual_mlp(method: str, residual_model: nn.Module, residual_spec: ModelSpec) -> None:
    # group_size=32 so that the per-group methods find layers (inputs of 32 and 64 features).
    config = QuantizeConfig(method=method, group_size=32)
    ctx = _ctx(residual_spec)
    quantized = apply(residual_model, config, ctx)
    assert sorted(ctx.records["quantize.layers"]) == ["block1.0", "block1.2", "block2.0", "block2.2"]
    assert _accuracy(quantized, residual_spec) >= _accuracy(residual_model, residual_spec) - ACCURACY_FLOOR


@pytest.mark.parametrize("method", ["int8_dynamic", "intx_weight_only"])
def test_asymmetric_mapping_runs(method: str, residual_model: nn.Module, residual_spec: ModelSpec) -> None:
    if method not in CPU_METHODS:
        pytest.fail(f"{method} should run on the CPU")
    config = QuantizeConfig(method=method, group_size=32, mapping="asymmetric")
    quantized = apply(residual_model, config, _ctx(residual_spec))
    assert _quantized_linears(quantized) == {"block1.0", "block1.2", "block2.0", "block2.2"}
    assert _accuracy(quantized, residual_spec) >= _accuracy(residual_model, residual_spec) - ACCURACY_FLOOR


@pytest.mark.parametrize("method", CPU_DISALLOWED)
def test_disallowed_methods_are_infeasible_with_reason(
    method: str, digits_model: nn.Module, digits_spec: ModelSpec
) -> None:
    reason = METHODS[method].devices["cpu"] or ""
    with pytest.raises(InfeasibleConfig, match=f"{method} cannot run on cpu: {re.escape(reason)}"):
        apply(digits_model, QuantizeConfig(method=method), _ctx(digits_spec))


def test_cpu_table_disallows_int4_and_float8_dynamic() -> None:
    assert {"int4_weight_only", "float8_dynamic"} <= set(CPU_DISALLOWED)


def test_static_pt2e_quantizes_convolutions(
    digits_pt2e: tuple[nn.Module, StageContext],
    digits_model: nn.Module,
    digits_spec: ModelSpec,
    digits_float_accuracy: float,
) -> None:
    quantized, ctx = digits_pt2e
    assert isinstance(quantized, torch.fx.GraphModule)
    qd, aten = torch.ops.quantized_decomposed, torch.ops.aten
    convs = [n for n in quantized.graph.nodes if n.op == "call_function" and n.target == aten.conv2d.default]
    assert len(convs) == 3
    int8_convs = [
        c
        for c in convs
        if c.args[0].target == qd.dequantize_per_tensor.default
        and c.args[0].args[0].target == qd.quantize_per_tensor.default
        and c.args[1].target == qd.dequantize_per_channel.default
    ]
    # features.0 (288 weight elements < min_weight_elements) and the head stay float.
    assert len(int8_convs) == 2
    assert ctx.records["quantize.layers"] == ["features.3", "features.7", "classifier.1"]
    assert set(ctx.records["quantize.skipped"]) == {"features.0", "classifier.3"}
    assert _accuracy(quantized, digits_spec) >= digits_float_accuracy - ACCURACY_FLOOR
    # The float weights the int8 constants replace are gone, so the file shrinks.
    assert serialized_size_bytes(quantized) < 0.6 * serialized_size_bytes(digits_model)
    assert quantized.eval() is quantized  # the evaluator calls model.eval()


# --------------------------------------------------------------------------- layer filter


def test_filter_skips_head_small_and_protected_layers(residual_model: nn.Module, residual_spec: ModelSpec) -> None:
    spec = dataclasses.replace(residual_spec, protected_layers=("block1",))
    ctx = _ctx(spec)
    quantized = apply(residual_model, QuantizeConfig(method="int8_weight_only"), ctx)
    assert _quantized_linears(quantized) == {"block2.0", "block2.2"}
    assert ctx.records["quantize.skipped"] == {
        "stem": "weight has 512 elements < min_weight_elements=1024",
        "block1.0": "protected by the model spec",
        "block1.2": "protected by the model spec",
        "head": "output layer (skip_head=True)",
    }


def test_filter_without_head_skip_quantizes_everything(residual_model: nn.Module, residual_spec: ModelSpec) -> None:
    config = QuantizeConfig(method="int8_dynamic", min_weight_elements=0, skip_head=False)
    quantized = apply(residual_model, config, _ctx(residual_spec))
    assert _quantized_linears(quantized) == {"stem", "block1.0", "block1.2", "block2.0", "block2.2", "head"}


def test_filter_that_excludes_everything_is_infeasible(digits_model: nn.Module, digits_spec: ModelSpec) -> None:
    config = QuantizeConfig(method="int8_weight_only", min_weight_elements=10**9)
    with pytest.raises(InfeasibleConfig, match="no Linear layer passes the filter"):
        apply(digits_model, config, _ctx(digits_spec))


def test_group_size_mismatch_is_infeasible(residual_model: nn.Module, residual_spec: ModelSpec) -> None:
    with pytest.raises(InfeasibleConfig, match="not a multiple of group_size=128"):
        apply(residual_model, QuantizeConfig(method="intx_weight_only"), _ctx(residual_spec))


def test_torchao_error_becomes_infeasible(
    monkeypatch: pytest.MonkeyPatch, residual_model: nn.Module, residual_spec: ModelSpec
) -> None:
    def broken(*_args: object) -> None:
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(quantize_stage, "quantize_linear_layers", broken)
    with pytest.raises(
        InfeasibleConfig, match="int8_dynamic: quantization failed in torchao's quantize_: RuntimeError: no kernel "
                                "for this shape"
    ):
        apply(residual_model, QuantizeConfig(method="int8_dynamic"), _ctx(residual_spec))


def test_a_model_torch_export_cannot_trace_is_one_line_with_what_to_do(
    monkeypatch: pytest.MonkeyPatch, residual_model: nn.Module, residual_spec: ModelSpec
) -> None:
    """PT2E traces the model with torch.export; its errors run to dozens of lines (after the pack stage:
    a data-dependent shape). The infeasible reason is the first line and says what to do."""
    def untraceable(*_args: object) -> None:
        raise RuntimeError("Could not extract specialized integer from data-dependent expression u0\n\n"
                           "Caused by: ...\nFor more information, run with TORCH_LOGS=dynamic")

    monkeypatch.setattr(quantize_stage, "quantize_static_pt2e", untraceable)
    packed = dataclasses.replace(_ctx(residual_spec), upstream=(PackConfig(),))
    with pytest.raises(InfeasibleConfig) as caught:
        apply(residual_model, QuantizeConfig(method="int8_static_pt2e"), packed)
    reason = str(caught.value)
    assert "\n" not in reason and "TORCH_LOGS" not in reason
    assert reason.startswith("int8_static_pt2e: quantization failed in torch.export + the x86 inductor quantizer "
                             "(prepare, calibrate, convert): RuntimeError: Could not extract specialized")
    assert "quantize before it, or use int8_dynamic" in reason


def test_the_hint_names_only_stages_the_recipe_holds(
    monkeypatch: pytest.MonkeyPatch, residual_model: nn.Module, residual_spec: ModelSpec
) -> None:
    """A recipe without pack (``int8s | ov`` on an encoder whose calibration fails) is not told to move the pack
    stage: the reason names the library call that failed, and no stage the recipe does not hold."""
    def calibration_fails(*_args: object) -> None:
        raise RuntimeError("\"histogram_cpu\" not implemented for 'Int'")

    monkeypatch.setattr(quantize_stage, "quantize_static_pt2e", calibration_fails)
    with pytest.raises(InfeasibleConfig) as caught:
        apply(residual_model, QuantizeConfig(method="int8_static_pt2e"), _ctx(residual_spec))
    reason = str(caught.value)
    assert "pack" not in reason, reason
    assert "torch.export + the x86 inductor quantizer" in reason and "histogram_cpu" in reason


def test_int8_weight_only_shrinks_serialized_size(digits_model: nn.Module, digits_spec: ModelSpec) -> None:
    quantized = apply(digits_model, QuantizeConfig(method="int8_weight_only"), _ctx(digits_spec))
    # classifier.1 holds 131k of the 197k float weights; int8 makes it 4x smaller.
    assert serialized_size_bytes(quantized) < 0.6 * serialized_size_bytes(digits_model)


# --------------------------------------------------------------------------- suggest


def test_suggest_with_fixed_trials(digits_spec: ModelSpec) -> None:
    from optuna.trial import FixedTrial

    ctx = _ctx(digits_spec)
    assert QuantizeConfig.suggest(FixedTrial({"quantize.method": "none"}), ctx) is None
    # FixedTrial raises for a parameter it was not given: int8_weight_only asks for nothing else.
    weight_only = {"quantize.method": "int8_weight_only", "quantize.fallback": False}
    assert QuantizeConfig.suggest(FixedTrial(weight_only), ctx) == QuantizeConfig(method="int8_weight_only")
    params = {"quantize.method": "intx_weight_only", "quantize.group_size": 64, "quantize.mapping": "asymmetric",
              "quantize.fallback": False}
    assert QuantizeConfig.suggest(FixedTrial(params), ctx) == QuantizeConfig(
        method="intx_weight_only", group_size=64, mapping="asymmetric"
    )
    guarded = {"quantize.method": "int8_dynamic", "quantize.mapping": "symmetric", "quantize.fallback": True,
               "quantize.fallback_budget": 0.02}
    assert QuantizeConfig.suggest(FixedTrial(guarded), ctx) == QuantizeConfig(
        method="int8_dynamic", fallback_budget=0.02
    )
    trial = FixedTrial({"quantize.method": "int8_dynamic", "quantize.mapping": "symmetric", "quantize.fallback": False})
    assert QuantizeConfig.suggest(trial, ctx) == QuantizeConfig(method="int8_dynamic")
    assert trial.distributions["quantize.method"].choices == ("none", *CPU_METHODS)


def test_a_config_that_quantizes_nothing_says_why() -> None:
    """Not "left every layer in float ([])": the budget that kept the layers float, and how many."""
    layers = [f"blocks.{i}.fc" for i in range(45)]
    config = QuantizeConfig(method="int8_dynamic", fallback_budget=0.015)
    kept = quantize_stage._keep_float(LayerSelection(selected=layers, skipped={}), dict.fromkeys(layers, 1.0),
                                      "fallback_budget")
    assert quantize_stage._why_all_float(kept, config) == (
        "the fallback budget 0.015 kept all 45 selected layer(s) float (a larger budget quantizes some)")
    pinned = quantize_stage._keep_float(LayerSelection(selected=layers[:2], skipped={}), dict.fromkeys(layers, 0.0),
                                        "float_layers")
    assert quantize_stage._why_all_float(pinned, config) == "float_layers kept all 2 selected layer(s) float"
    untouched = LayerSelection(selected=layers[:3], skipped={})
    assert quantize_stage._why_all_float(untouched, config) == "the quantizer converted none of the 3 selected layer(s)"
    no_budget = QuantizeConfig(method="int8_static_pt2e")  # fallback_budget None (the int8s preset): no TypeError
    assert quantize_stage._why_all_float(untouched, no_budget) == quantize_stage._why_all_float(untouched, config)
    assert quantize_stage._why_all_float(pinned, no_budget) == "float_layers kept all 2 selected layer(s) float"
