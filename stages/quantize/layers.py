"""Which layers the quantize stage may touch: the output head, protected and small layers are skipped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import Tensor, nn

from paretorch.pipeline.core.spec import Batch
from paretorch.stages.common.layer_outputs import forward_with_layer_outputs, tensor_leaves

#: Layer types that ``torchao.quantization.quantize_`` quantizes.
LINEAR_TYPES: tuple[type[nn.Module], ...] = (nn.Linear,)
#: Layer types the PT2E x86 inductor quantizer quantizes (weighted ops).
CONV_AND_LINEAR_TYPES: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Linear)


@dataclass(frozen=True)
class LayerSelection:
    """The layers a method will quantize, and why each other candidate is skipped."""

    selected: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def is_candidate(module: nn.Module, layer_types: tuple[type[nn.Module], ...]) -> bool:
    """True for a layer of ``layer_types`` with a weight.

    ``NonDynamicallyQuantizableLinear`` (the out-projection inside
    ``nn.MultiheadAttention``, which calls ``F.multi_head_attention_forward`` with
    the raw weight) is never a candidate.
    """
    if isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear):
        return False
    return isinstance(module, layer_types) and isinstance(getattr(module, "weight", None), Tensor)


def output_layer_names(model: nn.Module, inputs: Batch, layer_types: tuple[type[nn.Module], ...]) -> set[str]:
    """Names of the layers of ``layer_types`` whose output *is* a tensor of the model output.

    Runs one forward with hooks. If no layer output reaches the model output
    unchanged (e.g. ``softmax(head(x))``), the last such layer executed is the head.
    """
    layers = {name: m for name, m in model.named_modules() if is_candidate(m, layer_types)}
    output, executed = forward_with_layer_outputs(model, inputs, layers)
    output_tensors = tensor_leaves(output)
    heads = {name for name, out in executed if any(out is tensor for tensor in output_tensors)}
    if not heads and executed:
        heads = {executed[-1][0]}
    return heads


def _is_protected(name: str, protected: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in protected)


def select_layers(
    model: nn.Module,
    inputs: Batch,
    *,
    layer_types: tuple[type[nn.Module], ...],
    min_weight_elements: int,
    skip_head: bool,
    protected: Sequence[str],
    group_size: int | None = None,
) -> LayerSelection:
    """Apply the layer filter: output head (if ``skip_head``), protected layers (a name or
    any module below it), weights with fewer than ``min_weight_elements`` elements, and,
    for per-group methods, layers whose input size is not a multiple of ``group_size``."""
    heads = output_layer_names(model, inputs, layer_types) if skip_head else set()
    selection = LayerSelection()
    for name, module in model.named_modules():
        if not is_candidate(module, layer_types):
            continue
        weight: Tensor = module.weight
        in_features = int(weight.shape[1]) if weight.dim() > 1 else int(weight.shape[0])
        if name in heads:
            selection.skipped[name] = "output layer (skip_head=True)"
        elif _is_protected(name, protected):
            selection.skipped[name] = "protected by the model spec"
        elif weight.numel() < min_weight_elements:
            selection.skipped[name] = (
                f"weight has {weight.numel()} elements < min_weight_elements={min_weight_elements}"
            )
        elif group_size is not None and in_features % group_size != 0:
            selection.skipped[name] = f"input size {in_features} is not a multiple of group_size={group_size}"
        else:
            selection.selected.append(name)
    return selection
