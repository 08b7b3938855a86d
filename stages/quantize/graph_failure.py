"""Which step of the static int8 (PT2E) flow failed, and at which op of the graph.

A failure inside a graph (an observer during calibration, a quantized op in the converted model's forward) comes
out of generated code that names no op. :func:`failing_op` runs the graph again node by node
(``torch.fx.Interpreter``) and describes the node that raised: its aten op, the value's dtype, the module it
belongs to and the source line it was traced from, e.g. ``the observer of aten.to.dtype (to, int32) feeding
aten.mul.Tensor (mul) in encoder.embeddings (MPNetEmbeddings), transformers/models/mpnet/modeling_mpnet.py:74 in
forward``.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from paretorch.pipeline.core.spec import Batch
from paretorch.stages.quantize.integer_observers import is_observer

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')


class StaticStepError(Exception):
    """A step of the PT2E flow (``step``) failed with ``cause``; ``op`` describes the node that raised where the
    step ran a graph (None: the step's own code failed, e.g. ``torch.export`` tracing)."""

    def __init__(self, step: str, op: str | None, cause: Exception) -> None:
        at = f" at {op}" if op else ""
        super().__init__(f"{step}{at}: {type(cause).__name__}: {cause}")
        self.step = step
        self.op = op
        self.cause = cause


class _Locator(torch.fx.Interpreter):
    """Runs a graph node by node and keeps the node that raised."""

    failed: torch.fx.Node | None = None

    def run_node(self, n: torch.fx.Node) -> object:
        try:
            return super().run_node(n)
        except Exception:
            self.failed = n
            raise


def failing_op(graph_module: torch.nn.Module, inputs: Batch) -> str | None:
    """The node of ``graph_module`` (a ``torch.fx.GraphModule``) that raises on ``inputs``, described
    (:func:`describe_node`); None for another module, or when the graph runs through node by node."""
    if not isinstance(graph_module, torch.fx.GraphModule):
        return None
    locator = _Locator(graph_module)
    try:
        with torch.no_grad():
            locator.run(*inputs)
    except Exception:  # the failure being located: its node is what this returns
        return describe_node(locator.failed) if locator.failed is not None else None
    return None


def describe_node(node: torch.fx.Node) -> str:
    """``node``'s op (for an observer: the op whose value it observes, and the op it feeds), the value's dtype, its
    module and class, and the source line it was traced from."""
    observed = node.args[0] if is_observer(node) and node.args else None
    op = observed if isinstance(observed, torch.fx.Node) else node
    value = op.meta.get("val")
    dtype = f", {str(value.dtype).removeprefix('torch.')}" if isinstance(value, Tensor) else ""
    target = op.target if op.op == "call_function" else f"{op.op} {op.target}"
    described = f"{'the observer of ' if op is not node else ''}{target} ({op.name}{dtype})"
    consumers = [user for user in node.users if user.op == "call_function"] if op is not node else []
    if consumers:  # an input observer: the op it quantizes the input of
        described += f" feeding {consumers[0].target} ({consumers[0].name})"
    stack = op.meta.get("nn_module_stack")
    if stack:
        path, kind = list(stack.values())[-1]
        described += f" in {path} ({getattr(kind, '__name__', str(kind)).rsplit('.', 1)[-1]})"
    frames = list(_FRAME.finditer(str(op.meta.get("stack_trace") or "")))
    if frames:
        last = frames[-1]
        source = re.split(r"site-packages/|/paretorch/", last["file"])[-1]
        described += f", {source}:{last['line']} in {last['function']}"
    return described
