"""Params and MACs of a quantized model equal the float model's (quantization changes their precision)."""

from __future__ import annotations

import pytest
import torch

from paretorch.pipeline.core.evaluate import count_macs, count_params
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply_stage, config_from_dict

CPU_METHODS = ["int8_dynamic", "int8_weight_only", "intx_weight_only", "int8_static_pt2e"]


@pytest.mark.parametrize("method", CPU_METHODS)
def test_quantized_counts_match_the_float_model(method: str, residual_spec: ModelSpec) -> None:
    model = spec_model = residual_spec.build()
    inputs = residual_spec.example_inputs(1)
    ctx = StageContext(spec=residual_spec, device=torch.device("cpu"))
    quantized = apply_stage(spec_model, config_from_dict({"stage": "quantize", "method": method, "group_size": 32}),
                            ctx)
    assert ctx.records["quantize.layers"], f"{method} quantized no layer: the test would prove nothing"
    assert count_params(quantized) == count_params(model) == 9060
    assert count_macs(quantized, inputs) == count_macs(model, inputs) == 8832
