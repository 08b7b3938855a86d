"""Attention per sequence over packed tokens: each sequence's tokens attend to their own sequence only.

Four kernels, all taking ``(T, heads, head_size)`` query / key / value and a
:class:`~paretorch.stages.pack.layout.PackedLayout`, returning ``(T, heads * head_size)``:

* ``varlen``: :func:`torch.nn.attention.varlen.varlen_attn` (Flash Attention over the sequence
  starts): CUDA, float16 / bfloat16 only (:func:`varlen_available`);
* ``flex``: :func:`~torch.nn.attention.flex_attention.flex_attention` over the whole packed sequence with a
  document mask (:func:`document_blocks`: each block of 128 queries visits only the key blocks of the
  sequences it holds), so short sequences share blocks instead of taking one each; fused only under
  ``torch.compile`` (eager runs torch's unfused reference, ``T x T`` scores);
* ``nested``: a nested jagged tensor per sequence and :func:`scaled_dot_product_attention`;
* ``padded``: the tokens scattered back into a ``(batch, width)`` padded layout (the layout's width
  bucket) for attention only, masked by the row lengths (the linear layers, the bulk of the work,
  still run on packed tokens).
"""

from __future__ import annotations

import importlib.util
from typing import Literal

import torch
from torch import Tensor
from torch.nn import functional

from paretorch.stages.pack.layout import PackedLayout

AttentionKind = Literal["varlen", "flex", "nested", "padded"]
#: Whether this torch has variable-length Flash Attention (``torch.nn.attention.varlen``, torch >= 2.10).
HAS_VARLEN = importlib.util.find_spec("torch.nn.attention.varlen") is not None
if HAS_VARLEN:
    from torch.nn.attention.varlen import varlen_attn
#: Whether this torch has FlexAttention's block masks.
HAS_FLEX = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
if HAS_FLEX:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
#: FlexAttention's block size (queries and keys).
FLEX_BLOCK = 128
#: Dtypes Flash Attention runs.
VARLEN_DTYPES = (torch.float16, torch.bfloat16)


def varlen_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``varlen`` runs for tensors of ``dtype`` on ``device``."""
    return HAS_VARLEN and device.type == "cuda" and dtype in VARLEN_DTYPES


def choose_kernel(requested: str, device: torch.device, dtype: torch.dtype) -> AttentionKind:
    """The kernel to run: ``requested``, or for ``auto``: ``flex`` on CUDA inside a compiled graph (fused there;
    on an H200, MiniLM b256 x 68 at 41 % real tokens, bf16, CUDA graphs: 35 us a layer against varlen's 65 us),
    else ``varlen`` where it runs, else ``padded`` (the fastest of the others on CPU, measured: see
    experiments/bench/packed_rows.py)."""
    if requested == "auto":
        if HAS_FLEX and device.type == "cuda" and torch.compiler.is_compiling():
            return "flex"
        return "varlen" if varlen_available(device, dtype) else "padded"
    if requested == "varlen" and not varlen_available(device, dtype):
        raise ValueError(f"varlen attention needs CUDA and float16/bfloat16 (here: {device.type}, {dtype}) "
                         "and torch.nn.attention.varlen")
    if requested == "flex" and not HAS_FLEX:
        raise ValueError("flex attention needs torch.nn.attention.flex_attention (torch >= 2.5)")
    if requested not in ("varlen", "flex", "nested", "padded"):
        raise ValueError(f"unknown attention kernel {requested!r}: choose auto, varlen, flex, nested or padded")
    return requested  # type: ignore[return-value]


def flex_length(tokens: int) -> int:
    """The length FlexAttention runs ``tokens`` packed tokens at: the next multiple of its block, the tail padded
    with tokens of the dummy sequence (they stay inside the last block, so the block ranges do not change).
    Compiled under CUDA graphs on an H200 (torch 2.11, MiniLM bf16), an unpadded 24- or 26-token bucket (one row,
    shorter than one block) gave embeddings 0.3 off fp32 (max abs); padded, 0.0012. An unpadded 224-token bucket
    (8 rows) was right (0.0018): seen wrong below one block only, padded at every length."""
    return -(-tokens // FLEX_BLOCK) * FLEX_BLOCK


def document_blocks(layout: PackedLayout) -> BlockMask:
    """FlexAttention's mask of a packed batch at :func:`flex_length`, from static-size operations on the layout:
    query block ``i`` visits the key blocks from the start of its first token's sequence to the end of its last
    token's (one contiguous range), and within them a token attends to its own sequence's tokens only (the
    padding tail: to the dummy sequence, row ``B``)."""
    rows, starts = layout.rows, layout.sequence_starts.long()
    tokens = int(rows.shape[0])
    blocks = -(-tokens // FLEX_BLOCK)
    length = flex_length(tokens)
    if length != tokens:
        rows = torch.cat([rows, rows.new_full((length - tokens,), int(layout.lengths.shape[0]))])
    index = torch.arange(blocks, device=rows.device)
    first = index * FLEX_BLOCK
    low = starts.index_select(0, rows.index_select(0, first)) // FLEX_BLOCK
    last_row = rows.index_select(0, (first + FLEX_BLOCK - 1).clamp_max(tokens - 1))
    high = (starts.index_select(0, last_row + 1) - 1) // FLEX_BLOCK
    visited = (low[:, None] + index[None, :]).clamp_max(blocks - 1)

    def same_sequence(batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
        return rows[query] == rows[key]

    return BlockMask.from_kv_blocks((high - low + 1).to(torch.int32)[None, None], visited.to(torch.int32)[None, None],
                                    BLOCK_SIZE=FLEX_BLOCK, mask_mod=same_sequence, seq_lengths=(length, length))


def packed_attention(kind: AttentionKind, query: Tensor, key: Tensor, value: Tensor, layout: PackedLayout,
                     scale: float, blocks: BlockMask | None = None) -> Tensor:
    """Attention of ``(T, heads, head_size)`` tensors within each packed sequence, ``(T, heads * head_size)``;
    ``blocks``: for ``flex``, the batch's :func:`document_blocks` (built once for all layers)."""
    tokens = query.shape[0]
    if kind == "varlen":
        return _varlen(query, key, value, layout, scale).reshape(tokens, -1)
    if kind == "flex":
        tail = flex_length(tokens) - tokens  # padded to whole blocks (flex_length says why); none at b256 x 68
        q, k, v = ((functional.pad(t, (0, 0, 0, 0, 0, tail)) if tail else t).transpose(0, 1).unsqueeze(0)
                   for t in (query, key, value))  # strided views, no copy (a whole-block length)
        if query.device.type != "cuda":  # torch's CPU lowering of flex_attention unpacks a dense 4-D input only
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = flex_attention(q, k, v, block_mask=blocks if blocks is not None else document_blocks(layout), scale=scale)
        return out.squeeze(0)[:, :tokens].transpose(0, 1).reshape(tokens, -1)  # type: ignore[union-attr]
    if kind == "nested":
        return _nested(query, key, value, layout, scale).reshape(tokens, -1)
    return _padded(query, key, value, layout, scale)


def _varlen(query: Tensor, key: Tensor, value: Tensor, layout: PackedLayout, scale: float) -> Tensor:
    # The layout's width bounds every row (the dummy sequence is cut to it too: flash attention only
    # needs an upper bound); a static bucket, so compiled graphs do not specialize on the longest row.
    starts, width = layout.sequence_starts, layout.width
    return varlen_attn(query, key, value, starts, starts, width, width, scale=scale)  # type: ignore[return-value]


def _nested(query: Tensor, key: Tensor, value: Tensor, layout: PackedLayout, scale: float) -> Tensor:
    offsets = layout.sequence_starts.long()
    q, k, v = (torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in (query, key, value))
    out = functional.scaled_dot_product_attention(q, k, v, scale=scale)
    return out.transpose(1, 2).values()


def _padded(query: Tensor, key: Tensor, value: Tensor, layout: PackedLayout, scale: float) -> Tensor:
    batch, width = int(layout.lengths.shape[0]), layout.width
    heads, size = int(query.shape[1]), int(query.shape[2])
    stacked = torch.stack((query, key, value), dim=1)  # (T, 3, heads, size): one scatter for the three
    buffer = stacked.new_zeros(batch * width + 1, 3, heads, size).index_copy(0, layout.scatter_index, stacked)
    padded = buffer[: batch * width].view(batch, width, 3, heads, size).permute(2, 0, 3, 1, 4)
    keep = (torch.arange(width, device=query.device) < layout.lengths[:, None]).view(batch, 1, 1, width)
    out = functional.scaled_dot_product_attention(padded[0], padded[1], padded[2], attn_mask=keep, scale=scale)
    return out.transpose(1, 2).reshape(batch * width, heads * size).index_select(0, layout.gather_index)
