"""ModelSpec: everything the pipeline needs to know about one model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

#: Positional inputs of one forward call: ``model(*batch)``.
Batch = tuple[Tensor, ...]
#: One evaluation batch: the inputs and the targets the metric compares against.
LabelledBatch = tuple[Batch, Tensor]


@dataclass(frozen=True)
class Metric:
    """A task metric computed on the device.

    ``compute(outputs, targets)`` receives the concatenated outputs of the whole
    evaluation split and the concatenated targets, both on the device, and
    returns a 0-dim tensor; the evaluator reads it back once.
    """

    name: str
    higher_is_better: bool
    compute: Callable[[Tensor, Tensor], Tensor]

    def drop(self, baseline: float, value: float) -> float:
        """How much worse ``value`` is than ``baseline`` (positive = worse)."""
        return baseline - value if self.higher_is_better else value - baseline


def accuracy(outputs: Tensor, targets: Tensor) -> Tensor:
    """Top-1 accuracy of class logits against integer labels."""
    return (outputs.argmax(dim=-1) == targets).float().mean()


ACCURACY = Metric("accuracy", higher_is_better=True, compute=accuracy)


@dataclass(frozen=True)
class ModelSpec:
    """A trained model plus the data the pipeline needs around it.

    * ``build()`` returns the trained model in eval mode, on the CPU.
    * ``example_inputs(batch_size)`` returns inputs for latency and tracing.
    * ``calibration()`` returns input batches for calibration (quantization,
      AMP sensitivity, Taylor importance); never overlaps evaluation.
    * ``evaluation()`` returns ``(inputs, targets)`` batches for the metric.
    * ``training()`` (optional) returns labelled batches for recovery
      fine-tuning, with ``loss(outputs, targets)``.
    * ``protected_layers``: module names no stage may prune or quantize
      (the output head is protected automatically by the stages).
    """

    name: str
    build: Callable[[], nn.Module]
    example_inputs: Callable[[int], Batch]
    calibration: Callable[[], Sequence[Batch]]
    evaluation: Callable[[], Sequence[LabelledBatch]]
    metric: Metric
    latency_batch_sizes: tuple[int, ...] = (1, 32)
    training: Callable[[], Sequence[LabelledBatch]] | None = None
    loss: Callable[[Tensor, Tensor], Tensor] | None = None
    protected_layers: tuple[str, ...] = ()
    #: Further metrics on the same outputs and targets, reported (ModelReport.extra) but not optimized,
    #: e.g. KL divergence next to top-1 agreement (see pipeline.fidelity).
    extra_metrics: tuple[Metric, ...] = ()
    description: str = ""
    #: Where the spec came from (filled in by resolution; shown in reports).
    source: str = field(default="", compare=False)


def move_batch(batch: Batch, device: torch.device, dtype: torch.dtype | None = None) -> Batch:
    """Move a batch to ``device``; floating tensors are cast to ``dtype`` if given."""
    return tuple(
        t.to(device=device, dtype=dtype) if dtype is not None and t.is_floating_point() else t.to(device)
        for t in batch
    )
