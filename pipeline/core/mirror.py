"""How the export stages reproduce the torch-side compression of a recipe.

Core ML and ONNX convert the *float* graph (the model before the numeric stages)
and then re-apply the recipe's compression with their own tools. Each model stage
says, in its :class:`~pipeline.core.stage.Stage` record, what exports must do about
it, in one of three ways:

* nothing: a structural stage (prune, distill) changes the float graph itself,
  so the exports carry it by converting that graph (``mirror=None``);
* a function ``config -> ExportMirror`` giving the facts below (a numeric stage
  such as quantize or amp, or unstructured pruning whose sparsity the exports
  store compressed);
* :class:`NotMirrored` with the reason, which every export records.

The exporters read one merged :class:`ExportMirror` (see
:func:`pipeline.core.stage.export_mirror`) and never import a stage module.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

LayerKind = Literal["linear", "conv"]
#: What a quantization does to activations: ``float`` (weight-only), ``dynamic`` (scales from each
#: input at run time), ``static`` (scales calibrated ahead of time).
ActivationQuant = Literal["float", "dynamic", "static"]


@dataclass(frozen=True)
class NotMirrored:
    """A numeric stage that the exports cannot reproduce; ``reason`` says why."""

    reason: str


@dataclass(frozen=True)
class ExportMirror:
    """The compression and precision policy an export reproduces.

    A stage's mirror function sets only the fields it knows; :meth:`merge`
    combines the stages of a recipe in order (later stages win).
    """

    #: Recipe name of the quantization method (kept in notes and metadata).
    quant_method: str | None = None
    #: 8 or 4 for integer weights the exports store; None: nothing to mirror as integers.
    quant_bits: int | None = None
    quant_group_size: int | None = None
    #: Whether the *weights* are symmetric (a method's activation mapping does not count).
    quant_symmetric: bool = True
    #: How the method treats activations (None: no quantization, or a stage that does not say).
    quant_activations: ActivationQuant | None = None
    #: Which layer kinds the torch-side quantization touched.
    quant_layer_kinds: tuple[LayerKind, ...] = ("linear",)
    #: The quantize stage's layer filter: smallest quantized weight, and whether the head stays float.
    quant_min_weight_elements: int | None = None
    quant_skip_head: bool = False
    #: Layers the quantize stage kept in float to hold its accuracy budget (module names).
    quant_float_layers: tuple[str, ...] = ()
    #: Why a quantization method has no export counterpart (e.g. float8 weights in Core ML).
    quant_unmirrored: str | None = None
    #: Zeroed weights the exports may store sparse (unstructured pruning).
    unstructured_sparsity: bool = False
    sparsity_ratio: float | None = None
    #: Mixed precision: the reduced dtype's name and the layers kept in float32.
    amp_dtype: str | None = None
    fp32_layers: tuple[str, ...] = ()
    #: ``"stage: reason"`` for every numeric stage the exports cannot reproduce.
    not_mirrored: tuple[str, ...] = ()

    def merge(self, other: ExportMirror) -> ExportMirror:
        """``self`` with every field that ``other`` sets (differs from the default) taken from ``other``;
        ``not_mirrored`` notes accumulate."""
        default = ExportMirror()
        changes = {
            f.name: getattr(other, f.name)
            for f in fields(self)
            if f.name != "not_mirrored" and getattr(other, f.name) != getattr(default, f.name)
        }
        return replace(self, **changes, not_mirrored=(*self.not_mirrored, *other.not_mirrored))
