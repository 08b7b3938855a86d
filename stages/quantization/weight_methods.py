"""The ``torchao.quantization.quantize_`` methods: weight-only and dynamic-activation
quantization of ``nn.Linear`` layers (convolutions stay float)."""

from __future__ import annotations

from typing import Any

from torch import nn

#: Methods that quantize weights per group of ``group_size`` input elements.
GROUPED_METHODS = frozenset({"int4_weight_only", "intx_weight_only"})
#: Methods whose torchao config takes a symmetric/asymmetric mapping, and what it applies to.
MAPPING_TARGET = {"intx_weight_only": "weights", "int8_dynamic": "activations"}
#: Methods run through ``quantize_`` (everything but the static PT2E flow).
QUANTIZE_METHODS = frozenset(
    {"int8_weight_only", "int8_dynamic", "int4_weight_only", "intx_weight_only", "float8_weight_only", "float8_dynamic"}
)

#: Whether torchao may change global inductor settings when it quantizes (see torchao_config).
SET_INDUCTOR_CONFIG = False


def torchao_config(method: str, group_size: int, mapping: str) -> Any:
    """The torchao ``AOBaseConfig`` of ``method`` (torchao imported here: it is slow to import)."""
    import torch
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Float8WeightOnlyConfig,
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        IntxWeightOnlyConfig,
        MappingType,
        PerGroup,
    )

    mapping_type = MappingType.ASYMMETRIC if mapping == "asymmetric" else MappingType.SYMMETRIC
    # set_inductor_config=False: torchao would otherwise change process-wide inductor
    # settings (coordinate-descent tuning, ...) and every later compile in the process.
    inductor = {"set_inductor_config": SET_INDUCTOR_CONFIG}
    if method == "int8_weight_only":
        return Int8WeightOnlyConfig(**inductor)
    if method == "int8_dynamic":
        return Int8DynamicActivationInt8WeightConfig(act_mapping_type=mapping_type, **inductor)
    if method == "int4_weight_only":
        return Int4WeightOnlyConfig(group_size=group_size, **inductor)
    if method == "intx_weight_only":
        return IntxWeightOnlyConfig(
            weight_dtype=torch.int4,  # type: ignore[attr-defined]  # real at runtime, absent from the stubs
            granularity=PerGroup(group_size),
            mapping_type=mapping_type,
        )
    if method == "float8_weight_only":
        return Float8WeightOnlyConfig(**inductor)
    if method == "float8_dynamic":
        return Float8DynamicActivationFloat8WeightConfig(**inductor)
    raise ValueError(f"'{method}' is not a quantize_ method: known are {', '.join(sorted(QUANTIZE_METHODS))}")


def quantize_linear_layers(model: nn.Module, method: str, group_size: int, mapping: str, layers: list[str]) -> None:
    """Quantize, in place, the ``nn.Linear`` layers named in ``layers`` with torchao's ``quantize_``."""
    from torchao.quantization import quantize_

    wanted = frozenset(layers)
    quantize_(
        model,
        torchao_config(method, group_size, mapping),
        filter_fn=lambda module, name: name in wanted and isinstance(module, nn.Linear),
    )
