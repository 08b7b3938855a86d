"""Forward hooks that make a mixed-precision policy part of the model itself.

They are module-level functions bound with :func:`functools.partial`, so a model
carrying them survives ``copy.deepcopy``, pickling, ``torch.compile`` (traced
inline, no graph break) and ``torch.export.export`` (the casts become
``aten.to`` / ``_to_copy`` nodes of the graph).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

#: The dtype names recipes use, to torch dtypes.
REDUCED_DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def cast_floating(tree: Any, dtype: torch.dtype) -> Any:
    """``tree`` (tensors in tuples, lists, dicts...) with every floating tensor cast to
    ``dtype``; integer, boolean and complex tensors (token ids, masks) are left alone."""

    # Fast paths for the common cases (a tensor, positional tensors, no kwargs): hooks run
    # on every call in eager mode, where a pytree walk costs more than the layer itself.
    if isinstance(tree, Tensor):
        return _cast_tensor(tree, dtype)
    if type(tree) in (tuple, dict) and not tree:
        return tree
    if type(tree) is tuple and all(type(leaf) is Tensor for leaf in tree):
        return tuple(_cast_tensor(leaf, dtype) for leaf in tree)
    return pytree.tree_map(lambda leaf: _cast_tensor(leaf, dtype) if isinstance(leaf, Tensor) else leaf, tree)


def _cast_tensor(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    if tensor.is_floating_point() and tensor.dtype != dtype:
        return tensor.to(dtype)
    return tensor


def cast_floating_inputs(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, dtype: torch.dtype
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Forward pre-hook (``with_kwargs=True``): run ``module`` on inputs of ``dtype``."""
    return cast_floating(args, dtype), cast_floating(kwargs, dtype)


def cast_floating_outputs_to_float32(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
    """Forward hook: hand ``module``'s floating outputs back as float32."""
    return cast_floating(output, torch.float32)


def input_cast_hook(dtype: torch.dtype) -> partial[tuple[tuple[Any, ...], dict[str, Any]]]:
    """The pre-hook that casts a layer's floating inputs to ``dtype``."""
    return partial(cast_floating_inputs, dtype=dtype)
