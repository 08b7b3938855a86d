"""Which weights a mirrored quantization touches: the layers the quantize stage chose.

The quantize stage leaves some layers in float: weights smaller than
``min_weight_elements``, the output head (``skip_head``), the spec's protected
layers, for per-group methods layers whose input size is not a multiple of the
group size, and the layers its accuracy budget kept float (``float_layers``).
The exporters apply the same filter to the converted graph, so Core ML and ONNX
quantize the same layers as torch did (where a converted weight can be traced
back to its module; see :func:`module_weight_key`).
"""

from __future__ import annotations

from dataclasses import dataclass

from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.stages.common.mirror_facts import LayerKind, WeightQuantization


@dataclass(frozen=True)
class LayerFilter:
    """The quantize stage's layer filter, as the exporters apply it."""

    kinds: tuple[LayerKind, ...]
    min_weight_elements: int
    skip_head: bool
    protected: tuple[str, ...]
    #: Per-group methods: the input size must be a multiple of it.
    group_size: int | None = None
    #: Layers the quantize stage kept in float to hold its accuracy budget.
    float_layers: tuple[str, ...] = ()

    @classmethod
    def from_upstream(
        cls, upstream: ExportMirror, protected: tuple[str, ...], default_min_elements: int
    ) -> LayerFilter:
        """The filter of the recipe's quantize config (``default_min_elements`` when it has none)."""
        quant = upstream.of(WeightQuantization)
        if quant is None:
            return cls(kinds=("linear",), min_weight_elements=default_min_elements, skip_head=False,
                       protected=protected)
        min_elements = quant.min_weight_elements
        return cls(
            kinds=quant.layer_kinds,
            min_weight_elements=default_min_elements if min_elements is None else min_elements,
            skip_head=quant.skip_head,
            protected=protected,
            group_size=quant.group_size if quant.bits == 4 else None,
            float_layers=quant.float_layers,
        )

    def skip_reason(self, weight_key: str, elements: int, input_size: int, is_head: bool) -> str | None:
        """Why a weight stays float, or None to quantize it.

        ``weight_key`` is the weight's name normalised by :func:`module_weight_key`.
        """
        if elements < self.min_weight_elements:
            return f"{elements} elements < {self.min_weight_elements}"
        if self.skip_head and is_head:
            return "output head"
        for layers, why in ((self.protected, "protected"), (self.float_layers, "kept float for accuracy")):
            for layer in layers:
                # Dots and underscores are alike after conversion: a sibling module "head_b" of a
                # protected "head" also matches (kept float: the safe side).
                key = module_weight_key(layer)
                if weight_key == f"{key}_weight" or weight_key.startswith(f"{key}_"):
                    return f"{why} ({layer})"
        if self.group_size and input_size % self.group_size:
            return f"input size {input_size} is not a multiple of group size {self.group_size}"
        return None


def module_weight_key(name: str) -> str:
    """A module or weight name in the one form every converter keeps: dots and
    underscores alike, without ``p_`` (torch.export parameter prefix) and
    ``_to_fp16`` (coremltools' cast suffix). ``classifier.1.weight`` and
    ``p_classifier_1_weight_to_fp16`` both become ``classifier_1_weight``."""
    key = name.replace(".", "_")
    key = key.removesuffix("_to_fp16")
    return key.removeprefix("p_")


def untraced_protected(layer_filter: LayerFilter, skip_reasons: list[str]) -> list[str]:
    """Protected layers no converted weight was matched to (their weights may have been
    renamed by the converter, e.g. transposed into anonymous constants)."""
    return [layer for layer in layer_filter.protected if f"protected ({layer})" not in skip_reasons]
