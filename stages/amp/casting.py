"""The casts that make a mixed-precision policy part of the model itself.

Two kinds, both module-level functions bound with :func:`functools.partial`, so a
model carrying them survives ``copy.deepcopy``, pickling, ``torch.compile`` and
``torch.export.export`` (the casts become ``aten.to`` / ``_to_copy`` nodes):

* the **boundary**: :func:`set_boundary` replaces the root module's ``forward`` (an
  instance attribute; the class is untouched) by :func:`boundary_forward`, which casts
  the floating inputs to the policy's input dtype (the full policy only), runs the
  model's own forward and hands its floating outputs back as float32. A forward *hook*
  on the root module would not do: ``torch.compile(module)`` runs a root module's hooks
  outside the compiled frame, so a root output-cast hook is a frame of its own, a second
  graph (``torch._dynamo.explain(...).graph_break_count == 1`` on MiniLM; and a CUDA
  graph split in two). The replaced ``forward`` is the frame dynamo compiles, and the
  casts are traced into it.
* **layer input casts** (partial policies only): a forward pre-hook per layer whose
  inputs arrive in another dtype than its own (:func:`input_cast_hook`); dynamo inlines
  pre-hooks of sub-modules into the graph, and a cast to the dtype a tensor already has
  traces to nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import TypeGuard, overload

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

#: The dtype names recipes use, to torch dtypes.
REDUCED_DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


@overload
def cast_floating(tree: Tensor, dtype: torch.dtype) -> Tensor: ...
@overload
def cast_floating(tree: tuple[object, ...], dtype: torch.dtype) -> tuple[object, ...]: ...
@overload
def cast_floating(tree: dict[str, object], dtype: torch.dtype) -> dict[str, object]: ...
@overload
def cast_floating(tree: object, dtype: torch.dtype) -> object: ...


def cast_floating(tree: object, dtype: torch.dtype) -> object:
    """``tree`` (tensors in tuples, lists, dicts...) with every floating tensor cast to
    ``dtype``; integer, boolean and complex tensors (token ids, masks) are left alone."""

    # Fast paths for the common cases (a tensor, positional tensors, no kwargs): casts run
    # on every call in eager mode, where a pytree walk costs more than the layer itself.
    if isinstance(tree, Tensor):
        return _cast_tensor(tree, dtype)
    if type(tree) in (tuple, dict) and not tree:
        return tree
    if type(tree) is tuple and all(type(leaf) is Tensor for leaf in tree):
        return tuple(_cast_tensor(leaf, dtype) for leaf in tree)
    return pytree.tree_map(lambda leaf: _cast_tensor(leaf, dtype) if isinstance(leaf, Tensor) else leaf, tree)


def floating_dtypes(tree: object) -> set[torch.dtype]:
    """The dtypes of the floating tensors in ``tree``."""
    return {leaf.dtype for leaf in pytree.tree_leaves(tree) if isinstance(leaf, Tensor) and leaf.is_floating_point()}


def _cast_tensor(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    if tensor.is_floating_point() and tensor.dtype != dtype:
        return tensor.to(dtype)
    return tensor


def cast_floating_inputs(
    module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object], *, dtype: torch.dtype
) -> tuple[tuple[object, ...], dict[str, object]]:
    """Forward pre-hook (``with_kwargs=True``): run ``module`` on inputs of ``dtype``."""
    return cast_floating(args, dtype), cast_floating(kwargs, dtype)


def input_cast_hook(dtype: torch.dtype) -> partial[tuple[tuple[object, ...], dict[str, object]]]:
    """The pre-hook that casts a layer's floating inputs to ``dtype``."""
    return partial(cast_floating_inputs, dtype=dtype)


def boundary_forward(
    module: nn.Module,
    inner: Callable[..., object] | None,
    input_dtype: torch.dtype | None,
    /,
    *args: object,
    **kwargs: object,
) -> object:
    """``module``'s forward with the model-boundary casts: floating inputs to ``input_dtype``
    (None: as given), floating outputs to float32. ``inner`` is a forward the instance had
    before (None: its class's)."""
    if input_dtype is not None:
        args, kwargs = cast_floating(args, input_dtype), cast_floating(kwargs, input_dtype)
    output = inner(*args, **kwargs) if inner is not None else type(module).forward(module, *args, **kwargs)
    return cast_floating(output, torch.float32)


def set_boundary(module: nn.Module, input_dtype: torch.dtype | None) -> None:
    """Make ``module``'s forward cast at the model boundary (:func:`boundary_forward`);
    setting it again replaces the earlier boundary. The forward keeps its signature
    (``inspect.signature(module.forward)``, the input names ``torch.export`` records)."""
    current = module.__dict__.get("forward")
    inner = current.args[1] if _is_boundary(current) else current
    forward = partial(boundary_forward, module, inner, input_dtype)
    forward.__signature__ = inspect.signature(inner if inner is not None else module.forward)  # type: ignore[attr-defined]
    module.forward = forward  # type: ignore[method-assign]


def _is_boundary(forward: object) -> TypeGuard[partial[object]]:
    return isinstance(forward, partial) and forward.func is boundary_forward
