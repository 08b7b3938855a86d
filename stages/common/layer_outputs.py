"""One forward pass that records what each named layer returned.

Prune, quantize and AMP all need to know which layer produces the model's output
(the head, never pruned or quantized; the layer whose output AMP casts back to
float32). They share this one hook-based pass.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree


def tensor_leaves(output: object) -> list[Tensor]:
    """Every tensor in a (nested) model output, in order."""
    return [leaf for leaf in pytree.tree_leaves(output) if isinstance(leaf, Tensor)]


def forward_with_layer_outputs(
    model: nn.Module, inputs: tuple[Tensor, ...], layers: Mapping[str, nn.Module]
) -> tuple[object, list[tuple[str, object]]]:
    """Run ``model(*inputs)`` once without gradients; return its output and the
    ``(name, output)`` of every call of ``layers``, in call order. The recorded
    outputs stay referenced, so identity checks against the model output are sound."""
    calls: list[tuple[str, object]] = []
    handles = [
        module.register_forward_hook(lambda _m, _args, out, name=name: calls.append((name, out)))
        for name, module in layers.items()
    ]
    try:
        with torch.no_grad():
            output = model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return output, calls


def floating_output_leaves(output: object) -> list[Tensor]:
    """The floating tensors of a model output (tensor, tuple, dict, ModelOutput...)."""
    return [leaf for leaf in tensor_leaves(output) if leaf.is_floating_point()]
