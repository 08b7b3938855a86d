"""No observer on an integer tensor in a graph that torchao's PT2E flow prepared.

torchao's x86 inductor quantizer annotates every ``aten.mul.Tensor`` of two same-shaped tensors (and every
``aten.matmul``) whatever their dtype. An encoder that computes integers with them, as MPNet, RoBERTa and XLM-R
number their positions (``mask * cumsum(mask)`` on int32 token masks), then gets histogram observers on integer
tensors, and calibration fails with ``"histogram_cpu" not implemented for 'Int'``. An integer tensor has no scale to
observe: :func:`drop_integer_observers` takes those observers out of the prepared graph before it calibrates, so
that such an op runs as it came (``convert_pt2e`` quantizes what is observed) and every float op is quantized as
the quantizer chose.
"""

from __future__ import annotations

import torch

#: The module names ``prepare_pt2e`` gives the observers it inserts.
OBSERVER_PREFIX = "activation_post_process"


def is_observer(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls an observer ``prepare_pt2e`` inserted."""
    return node.op == "call_module" and str(node.target).startswith(OBSERVER_PREFIX)


def observable(node: object) -> bool:
    """Whether ``node``'s value can have an activation observer: a floating-point tensor (its fake value from
    ``torch.export``); a value of unknown type counts as one, as the quantizer would have it."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return not isinstance(value, torch.Tensor) or value.dtype.is_floating_point


def drop_integer_observers(prepared: torch.fx.GraphModule) -> list[str]:
    """Take every observer of an integer or boolean value out of ``prepared`` (its users read the value itself);
    returns the ops whose values lost one, in graph order."""
    dropped: list[str] = []
    for node in list(prepared.graph.nodes):
        source = node.args[0] if is_observer(node) and node.args else None
        if isinstance(source, torch.fx.Node) and not observable(source):
            node.replace_all_uses_with(source)
            prepared.graph.erase_node(node)
            if source.name not in dropped:
                dropped.append(source.name)
    if dropped:
        prepared.graph.lint()
        prepared.recompile()
        prepared.delete_all_unused_submodules()
    return dropped
