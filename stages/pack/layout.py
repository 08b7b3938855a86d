"""The packing step: where each real token of a batch goes in the packed sequence.

The layout is built in two parts, so that nothing inside a call reads device memory:

* **on the host, where the lengths are known**: the row lengths give the sequence starts
  (``B + 2`` integers: each row's start, the dummy sequence's start, the packed length ``T``) and
  two static integers, ``T`` (the real tokens, or their bucket under static shapes:
  :mod:`paretorch.stages.pack.buckets`) and the attention width (the longest row, or its bucket under
  static shapes). From token id lists (:func:`pack_token_lists`: the packed ids and the starts
  in one int64 buffer, one copy to the device) or from a padded host batch (:func:`pack_padded`)
  this is host work on the user's data before the copy; from a padded batch already on the
  device (:func:`host_sizes`) it is one read of its token count (and, eager, its longest row; under
  static shapes the width is the batch's own), the one step a device-resident padded batch cannot
  avoid (it decides the shape). A one-row
  padded batch needs no read (:func:`single_row_starts`).
* **on the device, with static-size operations** (:func:`device_layout`): every index tensor from
  the starts (a cumulative sum of the row ends), inside the compiled graph, so a token bucket is one
  graph launch with its layout.

Tokens are packed row by row in column order, so each row's tokens are contiguous (one
sequence); a token's position id is its column, as the padded model's absolute positions
are. The packed sequence may be padded up to a bucket: the padding tokens form one dummy
sequence after the last row, which attends to itself only and is dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy
import torch
from torch import Tensor

from paretorch.stages.pack.buckets import TOKEN_BUCKETS, smallest_bucket


class PackedLayout(NamedTuple):
    """Index tensors of one packed batch of ``B`` rows (``T`` packed tokens, the dummy tokens of the
    bucket included), on the device, and the attention width ``W`` (at least the longest row)."""

    #: (T,) int64: each packed token's index in a flattened (B * W) padded buffer; dummy tokens: B * W - 1.
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
    #: The attention width: a static bound on every row's length (the longest row, or its bucket).
    width: int


class HostPacked(NamedTuple):
    """A batch packed on the host: one int64 buffer ``[packed ids (T), sequence starts (B + 2)]`` (the
    one copy to the device) and its static sizes."""

    buffer: Tensor
    #: T: the packed length (real tokens, or their bucket), dummy tokens included.
    tokens: int
    #: The attention width (:func:`attention_width`).
    width: int
    #: B: the rows.
    rows: int


def packed_length(real_tokens: int, bucket: bool, buckets: tuple[int, ...] = TOKEN_BUCKETS) -> int:
    """How long the packed sequence of ``real_tokens`` tokens is: the count itself, or its bucket
    (at least 1, so that an all-padding batch still has a shape)."""
    length = smallest_bucket(real_tokens, buckets) if bucket else real_tokens
    return max(1, length)


def attention_width(longest: int, bucket: bool, buckets: tuple[int, ...] = TOKEN_BUCKETS) -> int:
    """The static width attention is run at for rows of at most ``longest`` tokens: the longest itself, or
    under static shapes (``bucket``) its bucket, so that a compiled graph serves every batch whose longest row
    falls in it (and the same batch padded wider)."""
    return smallest_bucket(max(1, longest), buckets) if bucket else max(1, longest)


def starts_of(lengths: Sequence[int], tokens: int) -> list[int]:
    """The sequence starts of rows of ``lengths`` in a packed sequence of ``tokens`` tokens: each row's
    start, the dummy sequence's start (the real-token count) and ``tokens``."""
    return [0, *itertools.accumulate(lengths), tokens]


def pack_token_lists(token_lists: Sequence[Sequence[int]], bucket: bool,
                     buckets: tuple[int, ...] = TOKEN_BUCKETS) -> HostPacked:
    """Token id lists (a tokenizer's ``input_ids`` without padding) packed on the host: the ids row after
    row, 0 for the dummy tokens of the bucket (``bucket``), then the starts, in one int64 tensor."""
    if not token_lists:
        raise ValueError("no sequences to pack: give at least one list of token ids")
    lengths = [len(ids) for ids in token_lists]
    real = sum(lengths)
    tokens = packed_length(real, bucket, buckets)
    values = itertools.chain(itertools.chain.from_iterable(token_lists), itertools.repeat(0, tokens - real),
                             starts_of(lengths, tokens))
    # numpy reads an iterable of ints about 4x faster than torch.tensor(list) (10k ids: 0.56 vs 2.1 ms, one thread)
    buffer = torch.from_numpy(numpy.fromiter(values, dtype=numpy.int64, count=tokens + len(lengths) + 2))
    return HostPacked(buffer, tokens, attention_width(max(lengths), bucket, buckets), len(lengths))


def pack_padded(input_ids: Tensor, attention_mask: Tensor, bucket: bool,
                buckets: tuple[int, ...] = TOKEN_BUCKETS) -> HostPacked:
    """A right-padded batch on the host (``(B, W)`` ids and mask, non-zero = token) packed like
    :func:`pack_token_lists`."""
    if input_ids.device.type != "cpu" or attention_mask.device.type != "cpu":
        raise ValueError("pack_padded packs a host batch: give CPU tensors (a batch already on the device "
                         "runs through the model's forward)")
    if attention_mask.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(f"ids and mask must both be (batch, sequence), got {tuple(input_ids.shape)} and "
                         f"{tuple(attention_mask.shape)}")
    real = attention_mask.ne(0)
    lengths = real.sum(dim=1).tolist()
    tokens = packed_length(sum(lengths), bucket, buckets)
    ids = input_ids[real].long()
    tail = torch.tensor([0] * (tokens - ids.numel()) + starts_of(lengths, tokens), dtype=torch.int64)
    return HostPacked(torch.cat([ids, tail]), tokens, attention_width(max(lengths, default=1), bucket, buckets),
                      len(lengths))


@torch.compiler.disable
def host_sizes(attention_mask: Tensor, bucket: bool, buckets: tuple[int, ...] = TOKEN_BUCKETS) -> tuple[int, int]:
    """For a padded batch on the mask's device: ``T`` and the attention width, from integers read to the host
    (a device-to-host copy on an accelerator). Outside compiled graphs (its results are shapes); the starts are
    then built on the device (:func:`device_starts`). Under static shapes (``bucket``) the width is the batch's
    own padded width's bucket (a shape, not a read), so a compiled model has one graph per token bucket: MiniLM's
    58 evaluation chunks at b32 needed 15 (token bucket, longest-row bucket) graphs, 6 token buckets (a CPU compile
    is 10-20 s a graph); rows padded to the longest one, as tokenizers pad, have the same width either way. Eager,
    the exact token count and longest row (two integers in one read)."""
    if attention_mask.dim() != 2:
        raise ValueError(f"the padding mask must be (batch, sequence), got shape {tuple(attention_mask.shape)}")
    lengths = attention_mask.ne(0).sum(dim=1)
    if bucket:
        return packed_length(int(lengths.sum().item()), True, buckets), attention_width(
            int(attention_mask.shape[1]), True, buckets)
    total, longest = torch.stack([lengths.sum(), lengths.max()]).tolist()
    return packed_length(total, False, buckets), attention_width(longest, False, buckets)


def device_starts(lengths: Tensor, tokens: int) -> Tensor:
    """The ``(B + 2,)`` starts (:func:`starts_of`) of rows of ``lengths`` (int64, on their device) in a packed
    sequence of ``tokens`` tokens, by static-size operations (a part of the compiled graph)."""
    ends = lengths.cumsum(0)
    return torch.cat([ends.new_zeros(1), ends, ends.new_full((1,), tokens)])


def host_starts(attention_mask: Tensor, bucket: bool,
                buckets: tuple[int, ...] = TOKEN_BUCKETS) -> tuple[Tensor, int, int]:
    """For a padded batch on the mask's device: the sequence starts there (int64), ``T`` and the attention
    width (:func:`host_sizes`, then :func:`device_starts`)."""
    tokens, width = host_sizes(attention_mask, bucket, buckets)
    return device_starts(attention_mask.ne(0).sum(dim=1), tokens), tokens, width


def single_row_starts(attention_mask: Tensor) -> tuple[Tensor, int, int]:
    """For a one-row padded ``(1, W)`` batch: the starts on the device with no host read (its length is
    counted there), ``T = W`` (the row's padding is the dummy sequence) and width ``W``: the padded cost,
    never more (a one-row batch cut to its longest sample has no padding to skip)."""
    width = int(attention_mask.shape[1])
    length = attention_mask.ne(0).sum(dim=1)
    bounds = length.new_tensor([0, width])
    return torch.cat([bounds[:1], length, bounds[1:]]), width, width


def device_layout(starts: Tensor, tokens: int, width: int) -> PackedLayout:
    """The :class:`PackedLayout` of the ``(B + 2,)`` int64 ``starts`` on their device, from static-size
    operations only (no data-dependent shape, no host read): a part of the compiled graph."""
    batch = int(starts.shape[0]) - 2
    index = torch.arange(tokens, device=starts.device)
    # A token's row is the number of rows that end at or before it: a one at each row's end, summed up to it
    # (O(T + B)). torch.bucketize(arange(T), ends) ran on the CPU, but compiled with CUDA graphs on an H200 the
    # host-packed path hit an index-out-of-range assert in the position lookup (not isolated further).
    ends = starts.new_zeros(tokens + 1).index_add(0, starts[1 : batch + 1], torch.ones_like(starts[1 : batch + 1]))
    rows = ends[:tokens].cumsum(0)
    real = rows < batch
    positions = torch.where(real, index - starts.index_select(0, rows), 0)
    scatter = rows * width + positions
    return PackedLayout(
        gather_index=scatter.clamp_max(batch * width - 1), scatter_index=scatter, positions=positions, rows=rows,
        sequence_starts=starts.to(torch.int32), first_tokens=starts[:batch].clamp_max(tokens - 1),
        lengths=starts[1 : batch + 1] - starts[:batch], width=width,
    )


def input_index(layout: PackedLayout, input_width: int) -> Tensor:
    """(T,) each packed token's index in the flattened ``(B, input_width)`` padded input (dummy tokens: 0)."""
    batch = int(layout.lengths.shape[0])
    return torch.where(layout.rows < batch, layout.rows * input_width + layout.positions, 0)
