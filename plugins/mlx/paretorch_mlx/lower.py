"""Lower a ``torch.export`` program to an MLX function: one ``mlx.core`` call per ATen op, weights converted once.

Why this route and not ONNX -> MLX: the project already traces every model with ``torch.export`` (``export.pt2``),
its ATen graph keeps torch's exact float32 semantics (no opset translation in between), the batch stays a symbolic
dimension, and no ONNX-to-MLX converter is in the pinned stack. The graph is the inference IR
(``run_decompositions({})``: dropout gone, ``to`` as ``_to_copy``), kept in torch's layouts (NCHW; a convolution or
pooling transposes to MLX's NHWC and back around itself).

Covered: what the built-in models use (convolution, batch norm in eval, max pooling, linear, layer norm, embedding,
scaled-dot-product attention with a boolean or additive mask, GELU, the elementwise and shape ops around them) and
common neighbours (softmax, matmul, mean, concatenation, adaptive average pooling to 1x1). Not covered, refused
by name before anything runs (:class:`UnsupportedOps`): any other op, e.g. recurrent layers, 3-D convolutions, pooling
with ``ceil_mode`` or dilation, in-place and random ops, custom ops (torchao's quantized tensors: MLX converts the
float graph and quantizes with its own kernels, :class:`QuantizedLinear`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn
import numpy as np
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

aten = torch.ops.aten

#: torch dtype -> MLX dtype.
DTYPES: dict[torch.dtype, Any] = {
    torch.float32: mx.float32, torch.float16: mx.float16, torch.bfloat16: mx.bfloat16, torch.int64: mx.int64,
    torch.int32: mx.int32, torch.int16: mx.int16, torch.int8: mx.int8, torch.uint8: mx.uint8, torch.bool: mx.bool_,
}


class UnsupportedOps(ValueError):
    """The program uses ops this lowering does not cover (named in the message)."""


@dataclass(frozen=True)
class QuantizedLinear:
    """MLX's own affine quantization of one linear weight (``mx.quantize``, as ``mlx.nn.quantize`` does)."""

    bits: int
    group_size: int


def to_mx(tensor: torch.Tensor) -> mx.array:
    """A torch tensor as an MLX array (through host memory; bfloat16 through float32)."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return mx.array(tensor.float().numpy()).astype(mx.bfloat16)
    return mx.array(tensor.numpy())


def to_torch(array: mx.array, device: torch.device) -> torch.Tensor:
    """An MLX array as a float32 torch tensor on ``device`` (integers and booleans keep their dtype)."""
    if array.dtype in (mx.bfloat16, mx.float16):
        array = array.astype(mx.float32)
    return torch.from_numpy(np.array(array, copy=False)).to(device)


def _dtype(dtype: torch.dtype | None, default: Any = None) -> Any:
    return default if dtype is None else DTYPES[dtype]


def _nhwc(x: mx.array) -> mx.array:
    return x.transpose(0, 2, 3, 1)


def _nchw(x: mx.array) -> mx.array:
    return x.transpose(0, 3, 1, 2)


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[-1]))


def _conv2d(x: mx.array, w: mx.array, b: mx.array | None = None, stride: Any = 1, padding: Any = 0,
            dilation: Any = 1, groups: int = 1) -> mx.array:
    # w arrives in MLX's (out, kh, kw, in) layout (converted once, :func:`lower`).
    y = mx.conv2d(_nhwc(x), w, stride=_pair(stride), padding=_pair(padding), dilation=_pair(dilation), groups=groups)
    return _nchw(y + b if b is not None else y)


def _max_pool2d(x: mx.array, kernel: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                ceil_mode: bool = False) -> mx.array:
    if ceil_mode or _pair(dilation) != (1, 1):
        raise UnsupportedOps("max_pool2d with ceil_mode or dilation")
    pool = mlx.nn.MaxPool2d(_pair(kernel), _pair(stride or kernel), _pair(padding))
    return _nchw(pool(_nhwc(x)))


def _adaptive_avg_pool2d(x: mx.array, size: Sequence[int]) -> mx.array:
    if tuple(size) != (1, 1):
        raise UnsupportedOps(f"adaptive_avg_pool2d to {tuple(size)} (only 1x1)")
    return mx.mean(x, axis=(2, 3), keepdims=True)


def _batch_norm(x: mx.array, w: mx.array | None, b: mx.array | None, mean: mx.array, var: mx.array,
                momentum: float, eps: float) -> tuple[mx.array, None, None]:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) * mx.rsqrt(var.reshape(shape) + eps)
    if w is not None:
        y = y * w.reshape(shape)
    if b is not None:
        y = y + b.reshape(shape)
    return y, None, None


def _layer_norm(x: mx.array, shape: Sequence[int], w: mx.array | None = None, b: mx.array | None = None,
                eps: float = 1e-5, cudnn: bool = True) -> mx.array:
    if len(shape) == 1:
        return mx.fast.layer_norm(x, w, b, eps)
    axes = tuple(range(-len(shape), 0))
    mean = mx.mean(x, axis=axes, keepdims=True)
    var = mx.var(x, axis=axes, keepdims=True)
    y = (x - mean) * mx.rsqrt(var + eps)
    return y * w + b if w is not None and b is not None else y


def _sdpa(q: mx.array, k: mx.array, v: mx.array, attn_mask: mx.array | None = None, dropout_p: float = 0.0,
          is_causal: bool = False, *, scale: float | None = None, enable_gqa: bool = False) -> mx.array:
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    mask: Any = "causal" if is_causal else attn_mask
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def _gelu(x: mx.array, approximate: str = "none") -> mx.array:
    if approximate == "tanh":
        return 0.5 * x * (1 + mx.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1 + mx.erf(x * (1 / math.sqrt(2))))


def _slice(x: mx.array, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> mx.array:
    index: list[Any] = [slice(None)] * x.ndim
    index[dim] = slice(start, None if end is None or end >= 2**62 else end, step)
    return x[tuple(index)]


def _expand(x: mx.array, size: Sequence[int], implicit: bool = False) -> mx.array:
    offset = len(size) - x.ndim
    shape = [x.shape[i - offset] if s == -1 else s for i, s in enumerate(size)]
    return mx.broadcast_to(x, shape)


def _index(x: mx.array, indices: Sequence[mx.array | None]) -> mx.array:
    return x[tuple(slice(None) if i is None else i for i in indices)]


def _sum(x: mx.array, dim: Sequence[int] | None = None, keepdim: bool = False, *, dtype: Any = None) -> mx.array:
    y = mx.sum(x, axis=tuple(dim) if dim else None, keepdims=keepdim)
    return y.astype(_dtype(dtype)) if dtype is not None else y


def _mean(x: mx.array, dim: Sequence[int] | None = None, keepdim: bool = False, *, dtype: Any = None) -> mx.array:
    return mx.mean(x, axis=tuple(dim) if dim else None, keepdims=keepdim)


def _vector_norm(x: mx.array, ord: float = 2, dim: Sequence[int] | None = None, keepdim: bool = False, *,
                 dtype: Any = None) -> mx.array:
    if ord != 2:
        raise UnsupportedOps(f"linalg_vector_norm of order {ord} (only 2)")
    return mx.sqrt(mx.sum(x * x, axis=tuple(dim) if dim else None, keepdims=keepdim))


def _to_copy(x: mx.array, *, dtype: torch.dtype | None = None, **_: Any) -> mx.array:
    return x.astype(DTYPES[dtype]) if dtype is not None else x


def _arange(*args: Any, dtype: torch.dtype | None = None, **_: Any) -> mx.array:
    ints = all(isinstance(a, int) for a in args)
    return mx.arange(*args, dtype=_dtype(dtype, mx.int64 if ints else mx.float32))  # type: ignore[call-overload]


def _new_full(x: mx.array, size: Sequence[int], value: float, *, dtype: torch.dtype | None = None,
              **_: Any) -> mx.array:
    dt = _dtype(dtype, x.dtype)
    return mx.full(list(size), value, dtype=dt).astype(dt)  # mlx 0.32.4: full(.., 1, dtype=bool_) gives int32


def _full(size: Sequence[int], value: float, *, dtype: torch.dtype | None = None, **_: Any) -> mx.array:
    dt = _dtype(dtype, mx.float32)
    return mx.full(list(size), value, dtype=dt).astype(dt)


def _logical_and(a: mx.array, b: mx.array) -> mx.array:
    return mx.logical_and(a, b) if a.dtype == mx.bool_ else mx.bitwise_and(a, b)


def _softmax(x: mx.array, dim: int, *rest: Any, **_: Any) -> mx.array:
    return mx.softmax(x, axis=dim, precise=True)


def _flatten(x: mx.array, start: int = 0, end: int = -1) -> mx.array:
    return mx.flatten(x, start, end)


def _squeeze(x: mx.array, dim: int | Sequence[int] | None = None) -> mx.array:
    if dim is None:
        return mx.squeeze(x)
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return mx.squeeze(x, axis=tuple(d for d in dims if x.shape[d] == 1)) if any(x.shape[d] == 1 for d in dims) else x


def _identity(x: Any, *_: Any, **__: Any) -> Any:
    return x


def _nothing(*_: Any, **__: Any) -> None:
    return None


#: ATen op -> its MLX function (positional arguments in the ATen schema's order).
OPS: dict[Any, Callable[..., Any]] = {
    aten.conv2d.default: _conv2d,
    aten._native_batch_norm_legit_no_training.default: _batch_norm,
    aten.max_pool2d.default: _max_pool2d,
    aten.adaptive_avg_pool2d.default: _adaptive_avg_pool2d,
    aten.layer_norm.default: _layer_norm,
    aten.scaled_dot_product_attention.default: _sdpa,
    aten.embedding.default: lambda w, idx, *_: mx.take(w, idx, axis=0),
    aten.gelu.default: _gelu,
    aten.relu.default: lambda x: mx.maximum(x, 0),
    aten.sigmoid.default: mx.sigmoid,
    aten.tanh.default: mx.tanh,
    aten.silu.default: lambda x: x * mx.sigmoid(x),
    aten.exp.default: mx.exp,
    aten.sqrt.default: mx.sqrt,
    aten.rsqrt.default: mx.rsqrt,
    aten.neg.default: mx.negative,
    aten.pow.Tensor_Scalar: mx.power,
    aten.add.Tensor: lambda a, b, alpha=1: a + b * alpha if alpha != 1 else a + b,
    aten.sub.Tensor: lambda a, b, alpha=1: a - b * alpha if alpha != 1 else a - b,
    aten.rsub.Scalar: lambda a, b, alpha=1: b - a * alpha,
    aten.mul.Tensor: operator.mul,
    aten.div.Tensor: operator.truediv,
    aten.clamp_min.default: mx.maximum,
    aten.clamp.default: lambda x, lo=None, hi=None: mx.clip(x, lo, hi),
    aten.ge.Scalar: operator.ge, aten.ge.Tensor: operator.ge,
    aten.gt.Scalar: operator.gt, aten.gt.Tensor: operator.gt,
    aten.le.Scalar: operator.le, aten.le.Tensor: operator.le,
    aten.lt.Scalar: operator.lt, aten.lt.Tensor: operator.lt,
    aten.eq.Scalar: operator.eq, aten.eq.Tensor: operator.eq,
    aten.ne.Scalar: operator.ne, aten.ne.Tensor: operator.ne,
    aten.__and__.Tensor: _logical_and, aten.bitwise_and.Tensor: _logical_and,
    aten.logical_not.default: mx.logical_not,
    aten.where.self: mx.where,
    aten.masked_fill.Scalar: lambda x, mask, value: mx.where(mask, mx.array(value, dtype=x.dtype), x),
    aten._softmax.default: _softmax, aten.softmax.int: _softmax,
    aten.matmul.default: mx.matmul, aten.bmm.default: mx.matmul, aten.mm.default: mx.matmul,
    aten.addmm.default: lambda b, x, w: mx.addmm(b, x, w),
    aten.linear.default: lambda x, w, b=None: x @ w.T + b if b is not None else x @ w.T,
    aten.sum.dim_IntList: _sum,
    aten.mean.dim: _mean,
    aten.linalg_vector_norm.default: _vector_norm,
    aten.cat.default: lambda xs, dim=0: mx.concatenate(xs, axis=dim),
    aten.view.default: mx.reshape, aten.reshape.default: mx.reshape, aten._unsafe_view.default: mx.reshape,
    aten.permute.default: mx.transpose,
    aten.transpose.int: mx.swapaxes,
    aten.t.default: lambda x: x.T,
    aten.unsqueeze.default: mx.expand_dims,
    aten.squeeze.dim: _squeeze, aten.squeeze.dims: _squeeze, aten.squeeze.default: _squeeze,
    aten.flatten.using_ints: _flatten,
    aten.expand.default: _expand,
    aten.slice.Tensor: _slice,
    aten.select.int: lambda x, dim, i: mx.take(x, i, axis=dim),
    aten.index.Tensor: _index,
    aten.gather.default: lambda x, dim, idx, sparse_grad=False: mx.take_along_axis(x, idx, axis=dim),
    aten._to_copy.default: _to_copy,
    aten.arange.default: _arange, aten.arange.start: _arange, aten.arange.start_step: _arange,
    aten.new_ones.default: lambda x, size, **kw: _new_full(x, size, 1, **kw),
    aten.new_zeros.default: lambda x, size, **kw: _new_full(x, size, 0, **kw),
    aten.full.default: _full,
    aten.scalar_tensor.default: lambda value, **kw: _full([], value, **kw),
    aten.clone.default: _identity, aten.alias.default: _identity, aten.detach.default: _identity,
    aten.dropout.default: _identity, aten.contiguous.default: _identity,
    aten._assert_tensor_metadata.default: _nothing, aten._assert_scalar.default: _nothing,
    aten.sym_constrain_range_for_size.default: _nothing,
    aten.sym_size.int: lambda x, dim: x.shape[dim],
    operator.getitem: operator.getitem,
    operator.mul: operator.mul, operator.add: operator.add, operator.sub: operator.sub,
    operator.floordiv: operator.floordiv,
}


def unsupported_ops(program: ExportedProgram) -> list[str]:
    """The ops of ``program`` this lowering does not cover, by name (empty: it lowers)."""
    return sorted({str(n.target) for n in program.graph.nodes if n.op == "call_function" and n.target not in OPS})


def _quantized_linear(wq: tuple[mx.array, mx.array, mx.array], scheme: QuantizedLinear) -> Callable[..., mx.array]:
    weight, scales, biases = wq

    def linear(x: mx.array, _w: Any, b: mx.array | None = None) -> mx.array:
        y = mx.quantized_matmul(x, weight, scales, biases, transpose=True, group_size=scheme.group_size,
                                bits=scheme.bits)
        return y + b if b is not None else y

    return linear


def _float_linear(w_t: mx.array) -> Callable[..., mx.array]:
    def linear(x: mx.array, _w: Any, b: mx.array | None = None) -> mx.array:
        return mx.addmm(b, x, w_t) if b is not None else x @ w_t

    return linear


@dataclass
class MLXProgram:
    """An exported program as MLX steps; call it with MLX arrays (the user inputs, in order)."""

    steps: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]]
    constants: dict[str, Any]
    inputs: list[str]
    outputs: list[str]
    #: Linear weights quantized by MLX, by parameter name; and the count of linear layers kept float.
    quantized: dict[str, QuantizedLinear]
    float_linears: int

    def __call__(self, *arrays: mx.array) -> list[mx.array]:
        env: dict[str, Any] = dict(self.constants)
        env.update(zip(self.inputs, arrays, strict=True))

        def value(arg: Any) -> Any:
            if isinstance(arg, _Ref):
                return env[arg.name]
            if isinstance(arg, list | tuple):
                return type(arg)(value(a) for a in arg)
            return arg

        for name, fn, args, kwargs in self.steps:
            env[name] = fn(*value(args), **{k: value(v) for k, v in kwargs.items()})
        return [env[name] for name in self.outputs]


@dataclass(frozen=True)
class _Ref:
    name: str


def _template(arg: Any) -> Any:
    if isinstance(arg, torch.fx.Node):
        return _Ref(arg.name)
    if isinstance(arg, list | tuple):
        return type(arg)(_template(a) for a in arg)
    if isinstance(arg, torch.dtype):
        return arg  # kept for _to_copy / arange, which map it themselves
    if isinstance(arg, torch.device | torch.layout | torch.memory_format):
        return None
    return arg


def lower(program: ExportedProgram, quantize: Mapping[str, QuantizedLinear] | None = None) -> MLXProgram:
    """``program`` (a ``torch.export`` program of a float model) as an :class:`MLXProgram`; ``quantize``: linear
    weights (by parameter name) that MLX quantizes. An op it does not cover is :class:`UnsupportedOps`."""
    program = program.run_decompositions({})
    if missing := unsupported_ops(program):
        raise UnsupportedOps(f"MLX lowering does not cover {', '.join(missing)}")
    quantize = dict(quantize or {})
    state = {**program.state_dict, **program.constants}
    targets: dict[str, str] = {}
    constants: dict[str, Any] = {}
    inputs: list[str] = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            inputs.append(spec.arg.name)
        elif spec.target is not None:
            targets[spec.arg.name] = spec.target
            constants[spec.arg.name] = to_mx(state[spec.target])
    steps: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []
    quantized: dict[str, QuantizedLinear] = {}
    float_linears = 0
    outputs: list[str] = []
    for node in program.graph.nodes:
        if node.op == "output":
            outputs = [a.name for a in node.args[0] if isinstance(a, torch.fx.Node)]
            continue
        if node.op != "call_function":
            continue
        args, kwargs = _template(tuple(node.args)), {k: _template(v) for k, v in node.kwargs.items()}
        fn = OPS[node.target]
        weight = args[1] if len(args) > 1 and isinstance(args[1], _Ref) and args[1].name in constants else None
        if node.target == aten.linear.default and weight is not None:
            target = targets[weight.name]
            scheme = quantize.get(target)
            if scheme is not None:
                w = constants[weight.name]
                fn = _quantized_linear(mx.quantize(w, group_size=scheme.group_size, bits=scheme.bits), scheme)
                quantized[target] = scheme
            else:
                fn = _float_linear(constants[weight.name].T)
                float_linears += 1
        elif node.target == aten.conv2d.default and weight is not None:
            constants[weight.name] = constants[weight.name].transpose(0, 2, 3, 1)  # MLX: (out, kh, kw, in)
        steps.append((node.name, fn, args, kwargs))
    if unknown := sorted(set(quantize) - set(quantized)):
        raise UnsupportedOps(f"MLX quantization names weights that are no linear weight here: {', '.join(unknown)}")
    return MLXProgram(steps, constants, inputs, outputs, quantized, float_linears)
