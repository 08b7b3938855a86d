"""The packing step: where each real token of a padded batch goes in the packed sequence.

It reads the padding mask on the host (a token count decides the packed length, so a CUDA
mask is copied to the host once per call) and returns index tensors on the mask's device.
Every later step is tensor work of static shape for a given batch size, input width and
token bucket, so :func:`pack_layout` is kept out of compiled graphs
(:func:`torch.compiler.disable`): ``torch.compile`` sees one graph break before it and one
graph after it, which CUDA graphs capture.

Tokens are packed row by row in column order, so each row's tokens are contiguous (one
sequence); a token's position id is its column, as the padded model's absolute positions
are. The packed sequence may be padded up to a bucket (:mod:`stages.pack.buckets`): the
padding tokens form one dummy sequence after the last row, which attends to itself only and
is dropped.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from stages.pack.buckets import TOKEN_BUCKETS, smallest_bucket


class PackedLayout(NamedTuple):
    """Index tensors of one packed batch of ``B`` rows of width ``W`` (``T`` packed tokens,
    the dummy tokens of the bucket included), on the mask's device."""

    #: (T,) int64: each packed token's index in the flattened (B * W) batch; dummy tokens: 0.
    gather_index: Tensor
    #: (T,) int64: the same, but dummy tokens point at the extra slot B * W of a (B * W + 1) buffer.
    scatter_index: Tensor
    #: (T,) int64: each token's position id (its column); dummy tokens: 0.
    positions: Tensor
    #: (T,) int64: each token's row; dummy tokens: B.
    rows: Tensor
    #: (B + 2,) int32: where each sequence starts (the rows, then the dummy sequence), and T.
    sequence_starts: Tensor
    #: (B,) int64: the packed index of each row's first token (clamped into range for empty rows).
    first_tokens: Tensor
    #: (B,) int64: real tokens per row.
    lengths: Tensor


def packed_length(real_tokens: int, bucket: bool, buckets: tuple[int, ...] = TOKEN_BUCKETS) -> int:
    """How long the packed sequence of ``real_tokens`` tokens is: the count itself, or its bucket
    (at least 1, so that an all-padding batch still has a shape)."""
    length = smallest_bucket(real_tokens, buckets) if bucket else real_tokens
    return max(1, length)


def build_layout(mask: Tensor, bucket: bool, buckets: tuple[int, ...] = TOKEN_BUCKETS) -> PackedLayout:
    """The :class:`PackedLayout` of a ``(batch, width)`` mask (non-zero = token), computed on the
    host and moved to the mask's device. ``bucket``: pad the packed length to its bucket."""
    if mask.dim() != 2:
        raise ValueError(f"the padding mask must be (batch, sequence), got shape {tuple(mask.shape)}")
    host = mask.detach().to("cpu").ne(0)
    batch, width = (int(n) for n in host.shape)
    real = host.reshape(-1).nonzero().squeeze(1)
    real_tokens = int(real.numel())
    total = packed_length(real_tokens, bucket, buckets)
    dummy = total - real_tokens
    lengths = host.sum(dim=1)
    gather = torch.cat([real, real.new_zeros(dummy)])
    scatter = torch.cat([real, real.new_full((dummy,), batch * width)])
    rows = torch.cat([real // width, real.new_full((dummy,), batch)])
    starts = torch.zeros(batch + 2, dtype=torch.int32)
    starts[1 : batch + 1] = lengths.cumsum(0).to(torch.int32)
    starts[batch + 1] = total
    first = starts[:batch].long().clamp_max(total - 1)
    layout = PackedLayout(gather, scatter, gather % width, rows, starts, first, lengths)
    if mask.device.type == "cpu":
        return layout
    return PackedLayout(*(t.to(mask.device, non_blocking=True) for t in layout))


#: :func:`build_layout` outside compiled graphs (its token count is data, not a shape).
pack_layout = torch.compiler.disable(build_layout)
