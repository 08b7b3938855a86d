"""The data a stage may train on (distillation), and the check that it never holds evaluation data.

:func:`distillation_data` is the one place that decides which batches distillation
reads: the spec's labelled ``training()`` batches (their labels feed the task loss),
else its unlabelled ``training_inputs()``, else its ``calibration()`` batches. Every
sample of the chosen batches is hashed and compared with the samples of the
evaluation set; any overlap is a :class:`SpecError`, so a metric is never measured on
data the model was trained to fit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch
from torch import Tensor

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.padding import cut_to
from paretorch.pipeline.core.spec import Batch, ModelSpec

TrainingSource = Literal["training", "training_inputs", "calibration"]


@dataclass(frozen=True)
class TrainingData:
    """Training samples concatenated over the spec's batches (all on the CPU).

    ``inputs`` are the positional forward inputs with the samples along dim 0;
    ``targets`` are the labels for the spec's loss, or None (unlabelled).
    ``padding_mask`` is the index of the input that is a right-padding mask
    (``ModelSpec.padding_mask``): then :meth:`batch` cuts the padding no sample needs.
    """

    source: TrainingSource
    inputs: Batch
    targets: Tensor | None
    padding_mask: int | None = None

    @property
    def samples(self) -> int:
        return int(self.inputs[0].shape[0])

    @cached_property
    def lengths(self) -> Tensor | None:
        """Tokens per sample (the padding mask's row sums), or None without a mask (computed once)."""
        if self.padding_mask is None:
            return None
        return self.inputs[self.padding_mask].ne(0).sum(dim=1)

    def batch(self, index: Tensor) -> tuple[Batch, Tensor | None]:
        """Samples ``index`` (inputs, targets), the sequence inputs cut to the longest of them."""
        inputs = tuple(t[index] for t in self.inputs)
        if self.lengths is not None and self.padding_mask is not None:
            inputs = cut_to(inputs, max(1, int(self.lengths[index].max())), self.padding_mask)
        return inputs, self.targets[index] if self.targets is not None else None


def sample_digests(batches: Iterable[Batch]) -> list[bytes]:
    """One digest per sample (row along dim 0) over every input tensor of each batch:
    equal digests, equal samples (same values, dtype and shape)."""
    digests = []
    for batch in batches:
        rows = [t.detach().cpu().contiguous() for t in batch]
        for i in range(rows[0].shape[0] if rows else 0):
            digest = hashlib.sha256()
            for tensor in rows:
                row = tensor[i]
                digest.update(f"{row.dtype}{tuple(row.shape)}".encode())
                digest.update(row.reshape(-1).view(torch.uint8).numpy().tobytes())
            digests.append(digest.digest())
    return digests


def check_no_evaluation_overlap(spec: ModelSpec, batches: Sequence[Batch], source: str) -> None:
    """:class:`SpecError` when any sample of ``batches`` is also an evaluation sample."""
    evaluation = set(sample_digests(inputs for inputs, _ in spec.evaluation()))
    training = sample_digests(batches)
    overlap = sum(digest in evaluation for digest in training)
    if overlap:
        raise SpecError(
            f"model '{spec.name}': {overlap} of {len(training)} samples of {source}() are also in the evaluation "
            f"set; evaluation data must never be trained on: remove them from {source}()"
        )


def distillation_data(spec: ModelSpec) -> TrainingData | None:
    """The samples distillation trains on, checked against the evaluation set; None when the
    spec has no training, training-input or calibration batches (or they are all empty)."""
    source: TrainingSource
    targets: Tensor | None = None
    if spec.training is not None and spec.loss is not None:
        labelled = list(spec.training())
        source, batches = "training", [inputs for inputs, _ in labelled]
        targets = torch.cat([t for _, t in labelled]) if labelled else None
    elif spec.training_inputs is not None:
        source, batches = "training_inputs", list(spec.training_inputs())
    else:
        source, batches = "calibration", list(spec.calibration())
    batches = [b for b in batches if b and b[0].shape[0] > 0]
    if not batches:
        return None
    check_no_evaluation_overlap(spec, batches, source)
    arity = {len(b) for b in batches}
    if len(arity) != 1:
        raise SpecError(f"model '{spec.name}': {source}() batches have different numbers of inputs {sorted(arity)}")
    try:
        inputs = tuple(torch.cat([b[i].detach().cpu() for b in batches]) for i in range(arity.pop()))
    except RuntimeError as exc:
        raise SpecError(f"model '{spec.name}': {source}() batches cannot be concatenated sample-wise "
                        f"(shapes differ beyond the batch dimension): {exc}") from exc
    if spec.padding_mask is not None:
        check_right_padding(spec.name, inputs, spec.padding_mask)
    return TrainingData(source, inputs, targets, spec.padding_mask)


def check_right_padding(name: str, inputs: Batch, index: int) -> None:
    """:class:`SpecError` unless ``inputs[index]`` is a (batch, sequence) mask padded on the right."""
    if not 0 <= index < len(inputs):
        raise SpecError(f"model '{name}': padding_mask={index} but the model takes {len(inputs)} inputs: "
                        f"give the index of its attention-mask input, or None")
    mask = inputs[index]
    if mask.dim() != 2:
        raise SpecError(f"model '{name}': padding_mask input {index} has shape {tuple(mask.shape)}; "
                        f"a (batch, sequence) mask is needed, or set padding_mask=None")
    positions = torch.arange(mask.shape[1])
    right_padded = (mask.ne(0) == (positions < mask.ne(0).sum(dim=1, keepdim=True))).all()
    if not bool(right_padded):
        raise SpecError(f"model '{name}': padding_mask input {index} is not padded on the right "
                        f"(tokens first, then zeros in every row): pad on the right, or set padding_mask=None")
