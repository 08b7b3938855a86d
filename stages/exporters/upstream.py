"""What the recipe before an export did, read from ``ctx.upstream``.

The export stages do not import the prune / quantize / amp modules: they read
the resolved configs by stage name (``prune``, ``quantize``, ``amp``) and field
names, so an exporter works with any config that has those fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stages.registry import StageConfig

PRUNE_STAGE = "prune"
QUANTIZE_STAGE = "quantize"
AMP_STAGE = "amp"

#: Quantization methods mirrored as 8-bit integer weights.
INT8_METHODS = frozenset({"int8_weight_only", "int8_dynamic", "int8_static_pt2e"})
#: Quantization methods mirrored as 4-bit weights.
INT4_METHODS = frozenset({"int4_weight_only", "intx_weight_only"})
#: Methods that quantize convolutions as well as linear layers (torchao's
#: ``quantize_`` only touches ``nn.Linear``; the PT2E quantizer also convolutions).
CONV_QUANT_METHODS = frozenset({"int8_static_pt2e"})
#: Methods whose ``mapping`` sets the activations' mapping, not the weights'.
ACTIVATION_MAPPING_METHODS = frozenset({"int8_dynamic"})

LayerKind = Literal["linear", "conv"]


@dataclass(frozen=True)
class UpstreamCompression:
    """The compression and precision policy of the recipe before an export."""

    quant_method: str | None = None
    quant_group_size: int | None = None
    quant_symmetric: bool = True
    #: The quantize stage's layer filter: smallest quantized weight, and whether the head stays float.
    quant_min_weight_elements: int | None = None
    quant_skip_head: bool = False
    prune_method: str | None = None
    prune_ratio: float | None = None
    amp_dtype: str | None = None
    fp32_layers: tuple[str, ...] = ()

    @property
    def quant_bits(self) -> int | None:
        """8 or 4 for the mirrored integer methods; None otherwise (none, float8)."""
        if self.quant_method in INT8_METHODS:
            return 8
        if self.quant_method in INT4_METHODS:
            return 4
        return None

    @property
    def quant_layer_kinds(self) -> tuple[LayerKind, ...]:
        """Which layer kinds the torch-side quantization touched."""
        if self.quant_method in CONV_QUANT_METHODS:
            return ("linear", "conv")
        return ("linear",)

    @property
    def unstructured_sparsity(self) -> bool:
        return self.prune_method == "unstructured"


def read_upstream(configs: Sequence[StageConfig]) -> UpstreamCompression:
    """Collect the last prune / quantize / amp config of the recipe into one view."""
    latest: dict[str, StageConfig] = {}
    for config in configs:
        latest[config.stage] = config
    quantize, prune, amp = latest.get(QUANTIZE_STAGE), latest.get(PRUNE_STAGE), latest.get(AMP_STAGE)
    return UpstreamCompression(
        quant_method=_field(quantize, "method"),
        quant_group_size=_field(quantize, "group_size"),
        quant_symmetric=_weights_symmetric(quantize),
        quant_min_weight_elements=_field(quantize, "min_weight_elements"),
        quant_skip_head=bool(_field(quantize, "skip_head", False)),
        prune_method=_field(prune, "method"),
        prune_ratio=_field(prune, "ratio"),
        amp_dtype=_field(amp, "dtype"),
        fp32_layers=tuple(_field(amp, "fp32_layers", ()) or ()),
    )


def _weights_symmetric(quantize: StageConfig | None) -> bool:
    """Asymmetric weights only where the recipe's mapping applies to weights: for
    ``int8_dynamic`` the mapping is the activations' (its weights stay symmetric)."""
    if _field(quantize, "mapping", "symmetric") != "asymmetric":
        return True
    return _field(quantize, "method") in ACTIVATION_MAPPING_METHODS


def _field(config: StageConfig | None, name: str, default: Any = None) -> Any:
    return default if config is None else getattr(config, name, default)
