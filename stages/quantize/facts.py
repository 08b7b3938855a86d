"""What the quantize stage knows about the unoptimized model before any trial: its Conv/Linear
layers (kind, weight size, output layer, protected), and the configs these facts rule out.

The layer filter of :func:`paretorch.stages.quantize.layers.select_layers` is applied to these facts
without running the model again. Upstream stages only remove layers or shrink them (pruning)
or retrain them (distillation), so a method that touches no layer of the unoptimized model
touches none after them either. The per-group filter (input size a multiple of
``group_size``) is not applied: pruning changes input sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from paretorch.pipeline.core.stage import StageContext
from paretorch.stages.common.mirror_facts import LayerKind
from paretorch.stages.quantize.layers import CONV_AND_LINEAR_TYPES, LINEAR_TYPES, is_candidate, output_layer_names
from paretorch.stages.quantize.methods import method

#: How many skipped layers a reason names before "and N more".
NAMED_LAYERS = 4


@dataclass(frozen=True)
class LayerFact:
    """One Conv/Linear layer the quantize methods could touch."""

    name: str
    kind: LayerKind
    weight_elements: int
    protected: bool


@dataclass(frozen=True)
class QuantizeFacts:
    """The model's candidate layers and its output layers, as the torchao (Linear) and the
    PT2E (Conv/Linear) filters each find them."""

    layers: tuple[LayerFact, ...]
    linear_heads: frozenset[str]
    conv_linear_heads: frozenset[str]


def read_facts(model: nn.Module, ctx: StageContext) -> QuantizeFacts:
    """The quantize facts of ``model`` (two forward passes with hooks, on ``ctx``'s example inputs)."""
    inputs = ctx.example_inputs()
    protected = tuple(ctx.spec.protected_layers)
    layers = tuple(
        LayerFact(name, "linear" if isinstance(module, nn.Linear) else "conv", int(module.weight.numel()),
                  any(name == p or name.startswith(p + ".") for p in protected))
        for name, module in model.named_modules() if is_candidate(module, CONV_AND_LINEAR_TYPES)
    )
    return QuantizeFacts(layers, frozenset(output_layer_names(model, inputs, LINEAR_TYPES)),
                         frozenset(output_layer_names(model, inputs, CONV_AND_LINEAR_TYPES)))


def touched_layers(facts: QuantizeFacts, name: str, min_weight_elements: int,
                   skip_head: bool) -> tuple[list[str], dict[str, str]]:
    """(layers method ``name`` would touch, {other candidate layer: why not}) under the layer filter."""
    record = method(name)
    heads = facts.conv_linear_heads if record.is_static else facts.linear_heads
    touched: list[str] = []
    skipped: dict[str, str] = {}
    for layer in facts.layers:
        if layer.kind not in record.layer_kinds:
            continue
        if skip_head and layer.name in heads:
            skipped[layer.name] = "the output layer (skip_head)"
        elif layer.protected:
            skipped[layer.name] = "protected by the model spec"
        elif layer.weight_elements < min_weight_elements:
            skipped[layer.name] = f"{layer.weight_elements} weights < min_weight_elements={min_weight_elements}"
        else:
            touched.append(layer.name)
    return touched, skipped


def why_untouched(facts: QuantizeFacts, name: str, min_weight_elements: int, skip_head: bool,
                  float_layers: tuple[str, ...] | None, fallback_budget: float | None) -> str | None:
    """Why a quantize config (these fields of it) cannot change the model ``facts`` describe: no layer
    its method touches, every one kept float, or a fallback budget over one layer only (keeping it float
    quantizes nothing; quantizing it is the config without the budget). None: it may change it."""
    touched, skipped = touched_layers(facts, name, min_weight_elements, skip_head)
    if not touched:
        kinds = "/".join(kind.capitalize() for kind in reversed(method(name).layer_kinds))
        return f"{name} touches no layer of this model: {_which(kinds, skipped)}"
    if float_layers is not None and set(touched) <= set(float_layers):
        return f"{name}: float_layers keeps every layer it touches in float ({', '.join(touched)})"
    if fallback_budget is not None and float_layers is None and len(touched) == 1:
        return (f"{name} touches one layer of this model ({touched[0]}): a fallback budget can only keep it "
                "float (nothing quantized) or quantize it (the same model as without the budget)")
    return None


def _which(kinds: str, skipped: dict[str, str]) -> str:
    if not skipped:
        return f"it has no {kinds} layer"
    named = "; ".join(f"{layer}: {why}" for layer, why in list(skipped.items())[:NAMED_LAYERS])
    more = f"; and {len(skipped) - NAMED_LAYERS} more" if len(skipped) > NAMED_LAYERS else ""
    return f"every {kinds} layer is skipped ({named}{more})"
