"""ModelSpec: everything the pipeline needs to know about one model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.bootstrap import resampled_means
from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.unoptimized_outputs import UnoptimizedOutputs

#: Positional inputs of one forward call: ``model(*batch)``.
Batch = tuple[Tensor, ...]
#: One evaluation batch: the inputs and the targets the metric compares against.
LabelledBatch = tuple[Batch, Tensor]

#: What a model's output is, for the fidelity metrics and the distillation loss:
#: class ``logits``, an ``embedding`` (or regression output), or ``auto`` (decided
#: from the output: :func:`paretorch.pipeline.core.fidelity.infer_output_kind`).
OutputKind = Literal["logits", "embedding"]
OUTPUT_KINDS: tuple[str, ...] = ("auto", "logits", "embedding")


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
    #: The metric's possible values (lowest, highest), if bounded: a drop larger than the span is impossible.
    bounds: tuple[float, float] | None = None
    #: ``resampled(outputs, targets)``: the metric on each of the fixed bootstrap resamples of its units,
    #: ``(RESAMPLES,)`` on the device (:mod:`paretorch.pipeline.core.bootstrap`); None: the metric has no interval.
    resampled: Callable[[Tensor, Tensor], Tensor] | None = None
    #: Each evaluation row is a unit of its own (accuracy: one example): the metric of any subset of the rows
    #: estimates the metric of all of them, so a trial may be judged on a subset first
    #: (paretorch.pipeline.search.subset).
    rowwise: bool = False

    def drop(self, baseline: float, value: float) -> float:
        """How much worse ``value`` is than ``baseline`` (positive = worse)."""
        return baseline - value if self.higher_is_better else value - baseline


def accuracy(outputs: Tensor, targets: Tensor) -> Tensor:
    """Top-1 accuracy of class logits against integer labels."""
    return (outputs.argmax(dim=-1) == targets).float().mean()


def resampled_accuracy(outputs: Tensor, targets: Tensor) -> Tensor:
    """Top-1 accuracy on each bootstrap resample of the examples."""
    return resampled_means(outputs.argmax(dim=-1) == targets)


ACCURACY = Metric("accuracy", higher_is_better=True, compute=accuracy, bounds=(0.0, 1.0),
                  resampled=resampled_accuracy, rowwise=True)


@dataclass(frozen=True)
class FidelityFloor:
    """``metric`` (an extra metric of the spec) must be at least ``floor``; ``why``: where the floor comes from.

    ``floor`` was calibrated for an allowed drop of ``share`` of the baseline task metric (0.01: 1 %). A stricter
    limit raises it toward ``perfect`` (the metric's value for an unchanged model) in proportion:
    :meth:`at`. A task metric that rises while the outputs move away from the unoptimized model's so cannot
    pass a near-zero limit ("lossless"); a looser limit keeps ``floor`` (calibrated there, conservative above).
    """

    metric: str
    floor: float
    why: str
    share: float = 0.01
    perfect: float = 1.0

    def at(self, allowed_share: float | None = None) -> float:
        """The floor for an allowed drop of ``allowed_share`` of the baseline task metric (None: ``floor``)."""
        if allowed_share is None or allowed_share >= self.share:
            return self.floor
        return self.perfect - (self.perfect - self.floor) * max(allowed_share, 0.0) / self.share

    def failure(self, extras: Mapping[str, float], allowed_share: float | None = None) -> str | None:
        """Why ``extras`` fail this floor at ``allowed_share`` (:meth:`at`; None when they meet it)."""
        floor = self.at(allowed_share)
        value = extras.get(self.metric)
        if value is None:
            return f"{self.metric} was not measured, and the spec sets a floor of {floor:.4g} on it"
        if value >= floor:
            return None
        scaled = "" if floor == self.floor else f", raised from {self.floor:g} for a drop below {self.share:.0%}"
        return f"{self.metric} {value:.4f} < floor {floor:.4g}{scaled} ({self.why})"


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
    * ``training_inputs()`` (optional) returns unlabelled input batches for
      training against the unoptimized model (distillation); without it,
      distillation reads ``training()``'s inputs, else ``calibration()``
      (see :mod:`paretorch.pipeline.core.training_data`). Never overlaps evaluation (checked).
    * ``output_kind``: ``logits``, ``embedding`` or ``auto`` (decided from the
      output); chooses the distillation loss.
    * ``padding_mask`` (optional): the index of the forward input that is a
      ``(batch, sequence)`` right-padding mask (1 = token, 0 = padding), e.g. 1 for a
      Hugging Face ``(input_ids, attention_mask)`` model. Training then cuts each batch
      to its longest sample and groups samples of similar length (the padding the
      model would ignore is not computed); ``example_inputs`` is then a sample of real
      inputs, and each latency batch is cut to its longest sample, or to a length bucket
      under a static-shape runtime (:mod:`paretorch.pipeline.core.padding`).
    * ``protected_layers``: module names no stage may prune or quantize
      (the output head is protected automatically by the stages).
    * ``encode_text`` (optional): texts -> the model's input batch (its tokenizer, padded
      alike); needed to score a text model on labelled text data (``--eval-data``,
      :mod:`paretorch.pipeline.core.task_spec`).
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
    training_inputs: Callable[[], Sequence[Batch]] | None = None
    output_kind: str = "auto"
    padding_mask: int | None = None
    protected_layers: tuple[str, ...] = ()
    encode_text: Callable[[Sequence[str]], Batch] | None = None
    #: Class names in index order (a classifier's ``id2label``): labels in --eval-data may use them.
    label_names: tuple[str, ...] = ()
    #: The text of each evaluation row, in row order, where the rows come from text (empty: not known): the
    #: worst inputs of a trial are named by it (:mod:`paretorch.pipeline.core.input_agreement`).
    evaluation_texts: tuple[str, ...] = ()
    #: The raw texts users send, in order (the texts ``example_inputs`` tokenizes): what the ``serve`` and ``corpus``
    #: workloads time from strings (:mod:`paretorch.pipeline.core.workload`; ``--eval-data`` makes them the user's own).
    latency_texts: Callable[[], Sequence[str]] | None = None
    #: Further metrics on the same outputs and targets, reported (ModelReport.extra) but not optimized,
    #: e.g. KL divergence next to top-1 agreement (see paretorch.pipeline.core.fidelity).
    extra_metrics: tuple[Metric, ...] = ()
    #: Extra metrics that must reach a floor for a trial to count (:mod:`paretorch.pipeline.core.fidelity_floor`).
    fidelity_floors: tuple[FidelityFloor, ...] = ()
    description: str = ""
    #: What the spec's built-in metric cannot judge (e.g. recipe families it misjudges) and what to do instead;
    #: printed at the start of a search, cleared when ``--eval-data`` replaces the metric.
    caveat: str = ""
    #: Where the spec came from (filled in by resolution; shown in reports).
    source: str = field(default="", compare=False)
    #: The unoptimized model's outputs per evaluation batch, run once for every reader
    #: (:mod:`paretorch.pipeline.core.unoptimized_outputs`); a spec derived with the same ``build`` shares it.
    unoptimized: UnoptimizedOutputs | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.output_kind not in OUTPUT_KINDS:
            raise SpecError(f"model '{self.name}': unknown output_kind '{self.output_kind}': "
                            f"choose one of {', '.join(OUTPUT_KINDS)}")
        if self.unoptimized is None or self.unoptimized.build is not self.build:
            object.__setattr__(self, "unoptimized", UnoptimizedOutputs(self.build))

    @property
    def unoptimized_outputs(self) -> UnoptimizedOutputs:
        """:attr:`unoptimized`, always set once the spec exists."""
        if self.unoptimized is None:
            raise AssertionError("ModelSpec.__post_init__ sets unoptimized")
        return self.unoptimized


#: Rows per evaluation / calibration batch where the data does not say.
BATCH_SIZE = 32


def split_batches(samples: Batch, batch_size: int = BATCH_SIZE) -> list[Batch]:
    """Cut a batch of samples into consecutive batches of ``batch_size``."""
    total = int(samples[0].shape[0])
    return [tuple(t[i : i + batch_size] for t in samples) for i in range(0, total, batch_size)]


def tile(samples: Batch, batch_size: int) -> Batch:
    """The first ``batch_size`` samples, repeating them if there are fewer."""
    total = int(samples[0].shape[0])
    repeats = -(-batch_size // total)
    return tuple(t.repeat(repeats, *([1] * (t.dim() - 1)))[:batch_size].contiguous() for t in samples)


def move_batch(batch: Batch, device: torch.device, dtype: torch.dtype | None = None) -> Batch:
    """Move a batch to ``device``; floating tensors are cast to ``dtype`` if given."""
    return tuple(
        t.to(device=device, dtype=dtype) if dtype is not None and t.is_floating_point() else t.to(device)
        for t in batch
    )


def load_model(spec: ModelSpec) -> nn.Module:
    """Build the spec's model and check that it runs on its example inputs.

    Returns the model in eval mode on the CPU; raises :class:`SpecError` when
    ``build()`` raises, returns something that is not a module, or when the
    forward pass fails or returns nothing usable.
    """
    try:
        model = spec.build()
    except Exception as exc:
        raise SpecError(f"building model '{spec.name}' failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise SpecError(f"model '{spec.name}': build() returned a {type(model).__name__}, not a torch.nn.Module")
    model.eval()
    try:
        inputs = spec.example_inputs(2)
    except Exception as exc:
        raise SpecError(f"model '{spec.name}': example_inputs(2) failed: {type(exc).__name__}: {exc}") from exc
    try:
        with torch.inference_mode():
            output = model(*inputs)
    except Exception as exc:
        raise SpecError(f"model '{spec.name}': forward on example inputs failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(output, torch.Tensor):
        raise SpecError(
            f"model '{spec.name}': forward returned {type(output).__name__}; it must return one tensor "
            "(wrap the model so that forward returns the tensor the metric reads)"
        )
    if output.shape[0] != 2 or not output.is_floating_point():
        raise SpecError(
            f"model '{spec.name}': forward returned shape {tuple(output.shape)} dtype {output.dtype}; "
            "expected a floating tensor with the batch (2) as its first dimension"
        )
    if not torch.isfinite(output).all():
        raise SpecError(f"model '{spec.name}': forward on example inputs returned NaN or inf")
    return model
