"""The quantization methods: one record per method, the only table of them.

Each :class:`QuantMethod` says how the method is built (its torchao config, or the
static PT2E flow), which layers it touches, where it runs (device kinds and the
reason elsewhere, read against the capability table's facts) and how the exports
mirror it (integer weight bits, weight mapping). Adding a method is one record here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from paretorch.pipeline.core.device import Capabilities
from paretorch.stages.common.mirror_facts import ActivationQuant, LayerKind

#: Whether torchao may change global inductor settings when it quantizes: it would
#: otherwise change process-wide inductor settings (coordinate-descent tuning, ...)
#: and every later compile in the process.
SET_INDUCTOR_CONFIG = False

MappingTarget = Literal["weights", "activations"]
NO_MPS_KERNEL = "torchao ships no MPS kernel for it"


@dataclass(frozen=True)
class QuantMethod:
    """One quantization method, as recipes name it."""

    name: str
    #: Device kind -> None (runs there) or the reason it does not; unlisted kinds: no kernel.
    devices: dict[str, str | None]
    #: torchao config factory ``(group_size, symmetric) -> AOBaseConfig``; None: the static PT2E flow.
    torchao: Callable[[int, bool], Any] | None
    layer_kinds: tuple[LayerKind, ...] = ("linear",)
    #: What it does to activations (ONNX Runtime mirrors dynamic and static int8, not weight-only).
    activations: ActivationQuant = "float"
    #: Integer weight bits the exports store (None: nothing integer to mirror, e.g. float8).
    weight_bits: int | None = None
    #: Quantizes weights per group of ``group_size`` input elements.
    grouped: bool = False
    #: What ``mapping`` (symmetric / asymmetric) applies to, where the method offers the choice.
    mapping_target: MappingTarget | None = None
    #: Minimum CUDA compute capability (float8).
    min_cuda_capability: tuple[int, int] | None = None
    #: Why the exports cannot mirror it, when they cannot.
    unmirrored: str | None = None
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def is_static(self) -> bool:
        return self.torchao is None

    def unavailable(self, caps: Capabilities) -> str | None:
        """Why this method cannot run on a device with ``caps``; None if it can."""
        reason = self.devices.get(caps.kind, "no kernel on this device")
        if reason is None and caps.kind == "cuda" and self.min_cuda_capability is not None:
            have = caps.cuda_capability or (0, 0)
            if have < self.min_cuda_capability:
                need = ".".join(map(str, self.min_cuda_capability))
                reason = f"it needs compute capability >= {need} (this GPU: {have[0]}.{have[1]})"
        return None if reason is None else f"{self.name} cannot run on {caps.kind}: {reason}"


def _int8_weight_only(group_size: int, symmetric: bool) -> Any:
    from torchao.quantization import Int8WeightOnlyConfig  # torchao is slow to import

    return Int8WeightOnlyConfig(set_inductor_config=SET_INDUCTOR_CONFIG)


def _int8_dynamic(group_size: int, symmetric: bool) -> Any:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, MappingType

    mapping = MappingType.SYMMETRIC if symmetric else MappingType.ASYMMETRIC
    return Int8DynamicActivationInt8WeightConfig(act_mapping_type=mapping, set_inductor_config=SET_INDUCTOR_CONFIG)


def _int4_weight_only(group_size: int, symmetric: bool) -> Any:
    from torchao.quantization import Int4WeightOnlyConfig

    return Int4WeightOnlyConfig(group_size=group_size, set_inductor_config=SET_INDUCTOR_CONFIG)


def _intx_weight_only(group_size: int, symmetric: bool) -> Any:
    from torchao.quantization import IntxWeightOnlyConfig, MappingType, PerGroup

    return IntxWeightOnlyConfig(
        weight_dtype=torch.int4,  # type: ignore[attr-defined]  # real at runtime, absent from the stubs
        granularity=PerGroup(group_size),
        mapping_type=MappingType.SYMMETRIC if symmetric else MappingType.ASYMMETRIC,
    )


def _float8_weight_only(group_size: int, symmetric: bool) -> Any:
    from torchao.quantization import Float8WeightOnlyConfig

    return Float8WeightOnlyConfig(set_inductor_config=SET_INDUCTOR_CONFIG)


def _float8_dynamic(group_size: int, symmetric: bool) -> Any:
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig

    return Float8DynamicActivationFloat8WeightConfig(set_inductor_config=SET_INDUCTOR_CONFIG)


_FLOAT8_CPU = "float8 dynamic activation needs CUDA compute capability >= 8.9"
_NO_CORE_ML_FLOAT8 = "Core ML has no float8 weights"

METHODS: dict[str, QuantMethod] = {
    m.name: m
    for m in (
        QuantMethod("int8_weight_only", {"cpu": None, "cuda": None, "mps": None}, _int8_weight_only, weight_bits=8),
        QuantMethod("int8_dynamic", {"cpu": None, "cuda": None, "mps": NO_MPS_KERNEL}, _int8_dynamic,
                    weight_bits=8, mapping_target="activations", activations="dynamic"),
        QuantMethod(
            "int4_weight_only",
            {"cpu": "torchao's int4 tile-packed kernel is CUDA-only (use intx_weight_only on CPU)",
             "cuda": None, "mps": NO_MPS_KERNEL},
            _int4_weight_only, weight_bits=4, grouped=True,
        ),
        QuantMethod("intx_weight_only", {"cpu": None, "cuda": None, "mps": NO_MPS_KERNEL}, _intx_weight_only,
                    weight_bits=4, grouped=True, mapping_target="weights"),
        QuantMethod("float8_weight_only", {"cpu": None, "cuda": None, "mps": NO_MPS_KERNEL}, _float8_weight_only,
                    min_cuda_capability=(8, 9), unmirrored=_NO_CORE_ML_FLOAT8),
        QuantMethod("float8_dynamic", {"cpu": _FLOAT8_CPU, "cuda": None, "mps": NO_MPS_KERNEL}, _float8_dynamic,
                    min_cuda_capability=(8, 9), unmirrored=_NO_CORE_ML_FLOAT8, activations="dynamic"),
        QuantMethod(
            "int8_static_pt2e",
            {"cpu": None, "cuda": "the PT2E x86 inductor quantizer targets CPUs", "mps": NO_MPS_KERNEL},
            None, layer_kinds=("linear", "conv"), weight_bits=8, activations="static",
        ),
    )
}


def method(name: str) -> QuantMethod:
    """The record of ``name``; an unknown name is a ValueError listing the known ones."""
    if name not in METHODS:
        raise ValueError(f"unknown quantization method '{name}': known are {', '.join(METHODS)}")
    return METHODS[name]


def methods_on(caps: Capabilities) -> list[str]:
    """Names of the methods that run on a device with ``caps``, sorted."""
    return sorted(name for name, m in METHODS.items() if m.unavailable(caps) is None)
