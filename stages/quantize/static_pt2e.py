"""Static int8 quantization of convolutions and linears through torchao's PT2E flow
(``torch.export`` -> ``prepare_pt2e`` with the x86 inductor quantizer -> calibration ->
``convert_pt2e``). The result is a ``torch.fx.GraphModule`` of quantize/dequantize ops
around float ops: it runs eager (slowly, the reference computation); inductor with
*freezing* enabled fuses the patterns into int8 oneDNN kernels."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import Batch
from paretorch.pipeline.core.token_inputs import is_token_input
from paretorch.stages.quantize.graph_failure import StaticStepError, failing_op
from paretorch.stages.quantize.integer_observers import drop_integer_observers

#: Key in ``GraphModule.meta``: True when the graph needs ``torch.compile`` with
#: inductor freezing (``options={"freezing": True}``) to run its int8 kernels.
INDUCTOR_FREEZING_META_KEY = "paretorch.inductor_freezing"


def _weighted_ops() -> frozenset[object]:
    aten = torch.ops.aten
    return frozenset({aten.conv1d.default, aten.conv2d.default, aten.linear.default})


def _dequantize_ops() -> frozenset[object]:
    qd = torch.ops.quantized_decomposed
    return frozenset(
        {
            qd.dequantize_per_tensor.default,
            qd.dequantize_per_tensor.tensor,
            qd.dequantize_per_channel.default,
        }
    )


def _batch_dynamic_shapes(inputs: Batch) -> tuple[dict[int, object] | None, ...]:
    """Dim 0 of every input may vary (calibration, evaluation and latency batches differ), and so may
    dim 1 of integer inputs of two or more dims: token ids and masks, whose batches are padded to their
    longest sample (``Dim.AUTO`` keeps a dim static where the model needs it)."""
    from torch.export import Dim

    def dims(t: Tensor) -> dict[int, object]:
        return {0: Dim.AUTO, 1: Dim.AUTO} if is_token_input(t) else {0: Dim.AUTO}

    return tuple(dims(t) if isinstance(t, Tensor) and t.dim() > 0 else None for t in inputs)


def quantize_static_pt2e(
    model: nn.Module,
    example_inputs: Batch,
    calibration_batches: Sequence[Batch],
    skip_layers: Iterable[str],
) -> torch.fx.GraphModule:
    """Export ``model``, insert observers everywhere the default x86 inductor recipe
    quantizes (uint8 affine per-tensor activations, int8 symmetric per-channel weights)
    except inside ``skip_layers`` and on integer tensors (:mod:`.integer_observers`), calibrate, and convert.
    A failing step raises :class:`~.graph_failure.StaticStepError` naming it (and the op, where a graph ran)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    try:
        exported = torch.export.export(
            model.eval(), example_inputs, dynamic_shapes=_batch_dynamic_shapes(example_inputs)
        ).module()
    except Exception as exc:  # torch.export raises many types for untraceable code
        raise StaticStepError("torch.export", None, exc) from exc
    prepared = _prepare(exported, model, skip_layers)
    with torch.no_grad():
        for batch in calibration_batches:
            try:
                prepared(*batch)
            except Exception as exc:  # an observer or an op of the traced graph: located below
                op = failing_op(prepared, batch)
                raise StaticStepError("the x86 inductor quantizer's calibration", op, exc) from exc
    try:
        converted = convert_pt2e(prepared)
    except Exception as exc:  # torchao raises many types
        raise StaticStepError("the x86 inductor quantizer's convert_pt2e", None, exc) from exc
    # PT2E replaces train()/eval() on the instance with methods that raise; the graph was
    # exported in eval mode and is fixed, so the ordinary flag-setting methods are right
    # (and the evaluator's ``model.eval()`` keeps working).
    for method in ("train", "eval"):
        converted.__dict__.pop(method, None)
    _drop_unused_state(converted)
    converted.meta[INDUCTOR_FREEZING_META_KEY] = True
    return converted


def _prepare(exported: torch.fx.GraphModule, model: nn.Module, skip_layers: Iterable[str]) -> torch.fx.GraphModule:
    """``prepare_pt2e`` with the x86 inductor quantizer (its default config, ``skip_layers`` float), without
    observers on integer tensors (:func:`~.integer_observers.drop_integer_observers`): the observed graph."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    shared = separate_stateless_calls(exported, model)
    tag_weighted_calls(exported)
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    for name in skip_layers:
        quantizer.set_module_name_qconfig(name, None)
    try:
        prepared = prepare_pt2e(exported, quantizer)
    except ValueError as exc:
        if "more than one output node" not in str(exc) or not shared:
            raise StaticStepError("the x86 inductor quantizer's prepare_pt2e", None, exc) from exc
        raise InfeasibleConfig(
            f"int8_static_pt2e: the x86 quantizer cannot annotate modules called at several places that "
            f"hold weights: {', '.join(sorted(shared))} ({exc}); give each call its own module"
        ) from exc
    except Exception as exc:  # torchao raises many types
        raise StaticStepError("the x86 inductor quantizer's prepare_pt2e", None, exc) from exc
    drop_integer_observers(prepared)
    return prepared


def separate_stateless_calls(exported: torch.fx.GraphModule, model: nn.Module) -> set[str]:
    """Make every call of a shared module its own partition for the PT2E quantizer.

    A module called at several places (one ``nn.ReLU`` reused after every convolution)
    is one source partition with several outputs, which the x86 quantizer rejects
    ("Input partition has more than one output node"). ``torch.export`` names each
    call apart in ``nn_module_stack`` (``act``, ``act@1``, ...); for a module without
    parameters or buffers (activations, pooling), the call's path becomes ``act@1``,
    as if each call had its own copy. Returns the shared modules that hold state
    (left as they are: a shared weight cannot be split)."""
    stateful: set[str] = set()
    for node in exported.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if node.op != "call_function" or not stack:
            continue
        key, (path, kind) = list(stack.items())[-1]
        _, at, call = key.rpartition("@")
        if not at or not call.isdigit():
            continue
        if _is_stateless(model, str(path)):
            stack[key] = (f"{path}@{call}", kind)
        else:
            stateful.add(str(path))
    return stateful


#: The functional source the x86 quantizer finds each weighted aten op by (``get_source_partitions`` reads a node's
#: ``source_fn_stack``).
WEIGHTED_SOURCES = {"conv1d": F.conv1d, "conv2d": F.conv2d, "conv3d": F.conv3d, "linear": F.linear}


def tag_weighted_calls(exported: torch.fx.GraphModule) -> int:
    """Give every convolution and linear node without a ``source_fn_stack`` its functional source, so that the x86
    quantizer annotates it; how many were tagged. ``torch.export`` records none for a call made inside a subclass's
    own ``forward`` (efficientnet_lite_pytorch's ``Conv2dStaticSamePadding(nn.Conv2d)`` calls ``F.conv2d``): the
    quantizer then saw none of EfficientNet-Lite0's convolutions (50 layers int8 with the tags,
    none without) and every int8 static preset quantized nothing."""
    tagged = 0
    for node in exported.graph.nodes:
        if node.op != "call_function" or "source_fn_stack" in node.meta:
            continue
        packet = getattr(node.target, "_overloadpacket", None)
        source = WEIGHTED_SOURCES.get(getattr(packet, "__name__", ""))
        if source is not None:
            node.meta["source_fn_stack"] = [(node.name, source)]
            tagged += 1
    return tagged


def _is_stateless(model: nn.Module, path: str) -> bool:
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return False  # a path torch.export normalised differently: leave the call as it is
    return next(module.parameters(), None) is None and next(module.buffers(), None) is None


def _drop_unused_state(graph_module: torch.fx.GraphModule) -> None:
    """Delete parameters and buffers no node reads: convert_pt2e leaves the float weights
    it replaced by int8 constants, which would double the serialized size."""
    used = {node.target for node in graph_module.graph.nodes if node.op == "get_attr"}
    state = [name for name, _ in graph_module.named_parameters()] + [name for name, _ in graph_module.named_buffers()]
    for name in state:
        if name not in used:
            owner_path, _, attr = name.rpartition(".")
            delattr(graph_module.get_submodule(owner_path) if owner_path else graph_module, attr)
    graph_module.delete_all_unused_submodules()


def _module_name(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return str(path)
    return node.name


def quantized_layer_names(graph_module: torch.fx.GraphModule) -> list[str]:
    """Modules whose convolution/linear reads both a dequantized input and a dequantized
    weight in ``graph_module``: the layers that run in int8 once lowered."""
    weighted, dequantize = _weighted_ops(), _dequantize_ops()
    names: list[str] = []
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target not in weighted:
            continue
        activation, weight = node.args[0], node.args[1]
        if all(isinstance(arg, torch.fx.Node) and arg.target in dequantize for arg in (activation, weight)):
            names.append(_module_name(node))
    return names
