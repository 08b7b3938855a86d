"""The export-mirror facts the stages share: what a numeric stage hands the exports to reproduce.

The stage that changes the numerics gives them (quantize: :class:`WeightQuantization`; amp:
:class:`ReducedPrecision`; unstructured pruning: :class:`Sparsity`; pack: :class:`PaddingFree`), each saying what
a runtime must reproduce to run it (:meth:`~paretorch.pipeline.core.mirror.MirrorFacts.needs`: a quantization scheme,
a precision, a stage, in words that name no runtime (each runtime declares what it reproduces); the export stages
read them from the recipe's merged :class:`~paretorch.pipeline.core.mirror.ExportMirror`
(``mirror.of(WeightQuantization)``). Neither side imports the other: both import these classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from paretorch.pipeline.core.length_groups import PACK
from paretorch.pipeline.core.mirror import MirrorFacts, Need, quant_group, quant_scheme

LayerKind = Literal["linear", "conv"]
#: What a quantization does to activations: ``float`` (weight-only), ``dynamic`` (scales from each
#: input at run time), ``static`` (scales calibrated ahead of time).
ActivationQuant = Literal["float", "dynamic", "static"]


@dataclass(frozen=True, kw_only=True)
class WeightQuantization(MirrorFacts):
    """Quantized weights: the method, what the exports store, and the layers it touched."""

    #: Recipe name of the quantization method (kept in notes and metadata).
    method: str
    #: 8 or 4 for integer weights the exports store; None: nothing to mirror as integers (float8).
    bits: int | None = None
    group_size: int | None = None
    #: Whether the *weights* are symmetric (a method's activation mapping does not count).
    symmetric: bool = True
    #: How the method treats activations.
    activations: ActivationQuant = "float"
    #: Which layer kinds the torch-side quantization touched.
    layer_kinds: tuple[LayerKind, ...] = ("linear",)
    #: The quantize stage's layer filter: smallest quantized weight, and whether the head stays float.
    min_weight_elements: int | None = None
    skip_head: bool = False
    #: Layers the quantize stage kept in float to hold its accuracy budget (module names).
    float_layers: tuple[str, ...] = ()
    #: Why the method has no Core ML counterpart (e.g. float8 weights).
    no_counterpart: str | None = None

    def needs(self) -> tuple[Need, ...]:
        scheme = quant_scheme(self.bits, self.activations)
        needs = [Need("quantization", (scheme,), f"quantize {self.method} ({scheme})")]
        if self.group_size is not None:
            group = quant_group(self.group_size)
            needs.append(Need("group", (group,), f"quantize {self.method} in {group}"))
        return tuple(needs)


@dataclass(frozen=True, kw_only=True)
class ReducedPrecision(MirrorFacts):
    """Mixed precision: the reduced dtype's name (``auto``: the device's preferred one) and the layers kept
    in float32 (empty before the amp stage has calibrated them: whole-model)."""

    dtype: str
    fp32_layers: tuple[str, ...] = ()

    def needs(self) -> tuple[Need, ...]:
        reduced = Need("precision", (self.dtype,), f"AMP ({self.dtype})")
        if not self.fp32_layers:
            return (reduced,)
        kept = Need("precision", ("mixed",), f"AMP keeps {len(self.fp32_layers)} layer(s) in float32")
        return (reduced, kept)


@dataclass(frozen=True, kw_only=True)
class Sparsity(MirrorFacts):
    """Zeroed weights (unstructured pruning) the exports may store sparse."""

    ratio: float


@dataclass(frozen=True, kw_only=True)
class PaddingFree(MirrorFacts):
    """Padding-free execution (the pack stage). Exports convert the padded graph (packing is how torch runs it,
    not part of the graph); a runtime that runs a file reproduces it by calling the file once per group of
    similar-length rows (:mod:`paretorch.pipeline.core.length_groups`), and declares so."""

    def needs(self) -> tuple[Need, ...]:
        return (Need("stage", (PACK,), "pack (padding-free execution)"),)
