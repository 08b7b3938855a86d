"""Sequence inputs at the lengths users send: each batch cut to its longest sample, or to a length bucket.

A spec of a padded sequence model (``ModelSpec.padding_mask``: the index of its
right-padding mask input) gives latency inputs as a *sample of real inputs*, padded
alike (``example_inputs``). The pipeline measures latency the way a user's serving code
runs the model: each batch padded to its longest sample (sentence-transformers does
this), not to the widest input the model takes. The padding a batch does not need is
masked out, so cutting it changes no output (tests/pipeline/core/test_padding.py).

Runtimes that compile for static shapes (``Runtime.static_shapes``, :mod:`paretorch.pipeline.core.runtimes`)
would compile anew for every length, so they are fed length *buckets*: each batch is
padded up to the smallest of :data:`BUCKETS` that fits it, as one serves such a model.
What a bucket costs is measured (latency at the bucket and at the batch's own length),
never assumed: :class:`LatencyInputs`.

Which latency batch is measured: the spec's sample (at least :data:`SAMPLE_ROWS` rows, or
:data:`SAMPLE_BATCHES` batches) is cut into consecutive batches, and the batch whose
longest sample is the median of them is timed (one batch, so that every trial and the
baseline are timed on the same inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paretorch.pipeline.core.runtimes.registry import get_runtime
from paretorch.pipeline.core.spec import Batch, ModelSpec, tile

#: Sequence-length buckets for runtimes that need static shapes (a longer batch keeps its own length).
BUCKETS: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
#: The latency sample: at least this many rows of the spec's example inputs ...
SAMPLE_ROWS = 256
#: ... and at least this many batches of the measured batch size.
SAMPLE_BATCHES = 8
#: How latency inputs are chosen, in the evaluation cache key (a change measures anew).
LATENCY_INPUTS = f"median batch of {SAMPLE_ROWS}+ rows, cut to its longest sample; static shapes: buckets {BUCKETS}"


def sequence_inputs(batch: Batch, mask_index: int) -> list[bool]:
    """Which inputs run along the mask's sequence axis: (batch, sequence, ...) tensors as wide as the mask."""
    width = int(batch[mask_index].shape[1])
    return [t.dim() >= 2 and int(t.shape[1]) == width for t in batch]


def longest(batch: Batch, mask_index: int) -> int:
    """Tokens in the batch's longest sample (at least 1): the mask's last non-zero column + 1."""
    mask = batch[mask_index]
    columns = mask.ne(0).any(dim=0).nonzero()
    return max(1, int(columns[-1]) + 1) if columns.numel() else 1


def cut_to(batch: Batch, length: int, mask_index: int) -> Batch:
    """The sequence inputs cut to their first ``length`` columns (no longer than they are)."""
    return tuple(t[:, :length] if is_sequence else t
                 for t, is_sequence in zip(batch, sequence_inputs(batch, mask_index), strict=True))


def trim_to_longest(batch: Batch, mask_index: int) -> Batch:
    """``batch`` padded to its longest sample: the trailing columns that are padding in every row removed."""
    return cut_to(batch, longest(batch, mask_index), mask_index)


def bucket_length(length: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest bucket that fits ``length`` tokens; ``length`` itself beyond the largest bucket."""
    return min((b for b in buckets if b >= length), default=length)


def pad_to(batch: Batch, length: int, mask_index: int, pad_id: int = 0) -> Batch:
    """The sequence inputs padded on the right to ``length`` columns (the mask with 0, the others with
    ``pad_id``), or cut to it when they are wider and the cut columns are padding."""
    width = int(batch[mask_index].shape[1])
    if length <= width:
        return cut_to(batch, max(length, longest(batch, mask_index)), mask_index)
    padded = []
    for index, (t, is_sequence) in enumerate(zip(batch, sequence_inputs(batch, mask_index), strict=True)):
        if is_sequence:
            fill = t.new_full((t.shape[0], length - width, *t.shape[2:]), 0 if index == mask_index else pad_id)
            t = torch.cat([t, fill], dim=1)
        padded.append(t)
    return tuple(padded)


def to_bucket(batch: Batch, mask_index: int, buckets: tuple[int, ...] = BUCKETS) -> Batch:
    """``batch`` cut to the smallest bucket that fits its longest sample; never wider than it came
    (the spec's own padding is the model's largest shape)."""
    width = int(batch[mask_index].shape[1])
    return cut_to(batch, min(width, bucket_length(longest(batch, mask_index), buckets)), mask_index)


def representative_batch(sample: Batch, batch_size: int, mask_index: int) -> Batch:
    """Of the consecutive ``batch_size`` batches of ``sample``, the one whose longest sample is the median."""
    rows = int(sample[0].shape[0])
    starts = list(range(0, max(1, rows - batch_size + 1), batch_size))
    by_length = sorted(starts, key=lambda s: (longest(tuple(t[s : s + batch_size] for t in sample), mask_index), s))
    start = by_length[(len(by_length) - 1) // 2]
    return tuple(t[start : start + batch_size].contiguous() for t in sample)


@dataclass(frozen=True)
class LatencyInputs:
    """What sequence length a latency batch was measured at.

    ``length``: the batch's longest sample (what per-batch padding gives); ``measured_length``:
    the width timed (a bucket under a static-shape runtime, else ``length``). ``trimmed_p50_ms``:
    the latency at ``length`` too, when the bucket is wider (the measured cost of bucketing)."""

    batch_size: int
    length: int
    measured_length: int
    mean_tokens: float
    trimmed_p50_ms: float | None = None

    def bucket_overhead_pct(self, bucket_p50_ms: float) -> float | None:
        """How much slower the bucket is than the batch's own length, in percent (None: not measured)."""
        if self.trimmed_p50_ms is None or self.trimmed_p50_ms <= 0:
            return None
        return 100.0 * (bucket_p50_ms - self.trimmed_p50_ms) / self.trimmed_p50_ms


def latency_sample(spec: ModelSpec, batch_size: int) -> Batch:
    """The spec's latency batch at ``batch_size`` (CPU), as the spec pads it: for a sequence spec the
    representative batch of its sample (:func:`representative_batch`), else ``example_inputs``."""
    if spec.padding_mask is None:
        return spec.example_inputs(batch_size)
    sample = spec.example_inputs(max(SAMPLE_ROWS, SAMPLE_BATCHES * batch_size))
    if int(sample[0].shape[0]) < batch_size:  # a spec that gives fewer rows than asked: repeat them
        sample = tile(sample, batch_size)
    return representative_batch(sample, batch_size, spec.padding_mask)


def latency_inputs(spec: ModelSpec, batch_size: int, runtime: str) -> tuple[Batch, LatencyInputs | None]:
    """The inputs to time ``runtime`` on at ``batch_size`` (CPU): a sequence spec's representative batch
    cut to its longest sample, or to its bucket under a static-shape runtime; and their lengths (None for
    specs without a padding mask). Every runtime and the baseline go through here: the same inputs."""
    batch = latency_sample(spec, batch_size)
    index = spec.padding_mask
    if index is None:
        return batch, None
    trimmed = trim_to_longest(batch, index)
    timed = to_bucket(batch, index) if get_runtime(runtime).static_shapes else trimmed
    tokens = batch[index].ne(0).sum(dim=1).float()
    lengths = LatencyInputs(batch_size, int(trimmed[index].shape[1]), int(timed[index].shape[1]),
                            float(tokens.mean()))
    return timed, lengths
