"""Fidelity metrics: how closely a model's outputs follow the unoptimized model's.

For a model without labels (an embedding model, a TorchScript file, a regressor)
the targets of the evaluation set are the *unoptimized* model's outputs on the
same inputs, and the metric compares the optimized model's outputs to them:

* classifiers (logits over classes): :data:`TOP1_AGREEMENT` (primary; share of
  inputs whose arg-max class is unchanged) and :data:`KL_DIVERGENCE`
  (mean KL(reference || optimized) of the softmax distributions, in nats);
* embeddings and regressors: :data:`MEAN_COSINE` (primary; mean cosine
  similarity per sample) and :data:`SQNR_DB` (signal-to-quantization-noise
  ratio over the whole output, in dB, clamped to +-:data:`SQNR_CAP_DB`);
* embeddings used for retrieval: :data:`NEIGHBOUR_AGREEMENT`.

Every ``compute(outputs, targets)`` runs on the device and returns a 0-dim
tensor, as :class:`pipeline.core.spec.Metric` requires. :func:`fidelity_spec` turns a
model plus unlabelled input batches into a :class:`ModelSpec` whose targets are
computed once, on the CPU, by the unoptimized model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import cache

import torch
from torch import Tensor, nn

from pipeline.core.errors import SpecError
from pipeline.core.spec import OUTPUT_KINDS, Batch, LabelledBatch, Metric, ModelSpec, OutputKind

# OUTPUT_KINDS / OutputKind: the one output-kind vocabulary lives in pipeline.core.spec (the
# distillation loss reads it too); importers of this module keep finding it here.

#: Identical outputs have infinite SQNR; the value is capped so that it stays a finite number in logs.
SQNR_CAP_DB = 200.0
#: A row whose L2 norm is within this of 1 counts as normalized (an embedding, not logits).
_UNIT_NORM_TOLERANCE = 1e-3


def _per_sample(tensor: Tensor) -> Tensor:
    """(batch, ...) -> (batch, features) in float32."""
    return tensor.float().reshape(tensor.shape[0], -1)


def _check_shapes(outputs: Tensor, targets: Tensor, name: str) -> None:
    if outputs.shape != targets.shape:
        raise ValueError(f"{name}: outputs {tuple(outputs.shape)} and targets {tuple(targets.shape)} differ in shape")


def top1_agreement(outputs: Tensor, targets: Tensor) -> Tensor:
    """Share of samples whose arg-max over the last dimension equals the reference's."""
    _check_shapes(outputs, targets, "top1_agreement")
    return (outputs.argmax(dim=-1) == targets.argmax(dim=-1)).float().mean()


def kl_divergence(outputs: Tensor, targets: Tensor) -> Tensor:
    """Mean KL(softmax(targets) || softmax(outputs)) over samples, in nats (0 = identical)."""
    _check_shapes(outputs, targets, "kl_divergence")
    log_p = torch.log_softmax(targets.float(), dim=-1)
    log_q = torch.log_softmax(outputs.float(), dim=-1)
    per_position = (log_p.exp() * (log_p - log_q)).sum(dim=-1)
    return per_position.mean().clamp_min(0.0)


def mean_cosine(outputs: Tensor, targets: Tensor) -> Tensor:
    """Mean cosine similarity between each sample's output and its reference (flattened per sample)."""
    _check_shapes(outputs, targets, "mean_cosine")
    return torch.nn.functional.cosine_similarity(_per_sample(outputs), _per_sample(targets), dim=1).mean()


def sqnr_db(outputs: Tensor, targets: Tensor) -> Tensor:
    """10 log10(sum reference^2 / sum (reference - output)^2), clamped to +-:data:`SQNR_CAP_DB`
    (identical outputs, all-zero ones included, give the cap)."""
    _check_shapes(outputs, targets, "sqnr_db")
    reference = targets.float()
    signal = reference.pow(2).sum()
    noise = (reference - outputs.float()).pow(2).sum()
    ratio_db = 10.0 * (torch.log10(signal) - torch.log10(noise))
    capped = torch.full_like(ratio_db, SQNR_CAP_DB)
    return torch.where(noise == 0, capped, ratio_db.nan_to_num(nan=-SQNR_CAP_DB).clamp(-SQNR_CAP_DB, SQNR_CAP_DB))


def neighbour_agreement(outputs: Tensor, targets: Tensor) -> Tensor:
    """Top-1 retrieval against the unoptimized embeddings.

    Each sample's output is a query against the index of reference embeddings,
    itself excluded; it agrees when it retrieves the same nearest neighbour (by
    cosine) as the reference embedding of that sample does. 1.0 means every
    search result is unchanged. Needs distinct inputs: duplicates tie.
    """
    _check_shapes(outputs, targets, "neighbour_agreement")
    if outputs.shape[0] < 2:
        raise ValueError("neighbour_agreement needs at least 2 samples")
    queries = torch.nn.functional.normalize(_per_sample(outputs), dim=1)
    index = torch.nn.functional.normalize(_per_sample(targets), dim=1)
    self_mask = torch.eye(index.shape[0], dtype=torch.bool, device=index.device)
    found = (queries @ index.T).masked_fill(self_mask, float("-inf")).argmax(dim=1)
    expected = (index @ index.T).masked_fill(self_mask, float("-inf")).argmax(dim=1)
    return (found == expected).float().mean()


TOP1_AGREEMENT = Metric("top1_agreement", higher_is_better=True, compute=top1_agreement, bounds=(0.0, 1.0))
KL_DIVERGENCE = Metric("kl_divergence", higher_is_better=False, compute=kl_divergence)
MEAN_COSINE = Metric("mean_cosine", higher_is_better=True, compute=mean_cosine, bounds=(-1.0, 1.0))
SQNR_DB = Metric("sqnr_db", higher_is_better=True, compute=sqnr_db)
NEIGHBOUR_AGREEMENT = Metric("neighbour_agreement", higher_is_better=True, compute=neighbour_agreement,
                             bounds=(0.0, 1.0))

#: Primary and extra fidelity metrics per output kind.
METRICS_BY_KIND: dict[str, tuple[Metric, ...]] = {
    "logits": (TOP1_AGREEMENT, KL_DIVERGENCE),
    "embedding": (MEAN_COSINE, SQNR_DB),
}


def infer_output_kind(output: Tensor) -> OutputKind:
    """The rule for ``--output-kind auto``.

    A 2-D floating output ``(batch, classes)`` with at least 2 columns whose
    rows are not unit-norm is taken for logits; anything else (one value per
    sample, unit-norm rows, sequences, feature maps) is an embedding or
    regression output.
    """
    if output.dim() == 2 and output.shape[1] >= 2:
        norms = output.float().norm(dim=1)
        if not torch.allclose(norms, torch.ones_like(norms), atol=_UNIT_NORM_TOLERANCE):
            return "logits"
    return "embedding"


def fidelity_metrics(kind: str) -> tuple[Metric, ...]:
    """(primary, *extras) for an output kind: ``logits`` or ``embedding``."""
    if kind not in METRICS_BY_KIND:
        raise ValueError(f"unknown output kind '{kind}': choose one of {', '.join(METRICS_BY_KIND)}")
    return METRICS_BY_KIND[kind]


def fidelity_report(outputs: Tensor, targets: Tensor, metrics: Sequence[Metric]) -> dict[str, float]:
    """Every metric of ``metrics`` on the same outputs, as name -> number."""
    return {metric.name: float(metric.compute(outputs, targets).item()) for metric in metrics}


def reference_outputs(model: nn.Module, batches: Sequence[Batch]) -> list[Tensor]:
    """The unoptimized model's outputs on ``batches`` (CPU, float32, no grad)."""
    outputs = []
    with torch.inference_mode():
        for batch in batches:
            output = model(*batch)
            if not isinstance(output, Tensor):
                raise SpecError(f"the model returned {type(output).__name__}, not a tensor; fidelity needs one tensor")
            outputs.append(output.detach().float().cpu().clone())
    return outputs


def fidelity_spec(
    name: str,
    build: Callable[[], nn.Module],
    example_inputs: Callable[[int], Batch],
    calibration: Callable[[], Sequence[Batch]],
    evaluation_inputs: Callable[[], Sequence[Batch]],
    output_kind: str = "auto",
    metric: Metric | None = None,
    extra_metrics: tuple[Metric, ...] | None = None,
    targets: Callable[[Sequence[Batch]], list[Tensor]] | None = None,
    **spec_fields: object,
) -> ModelSpec:
    """A :class:`ModelSpec` whose metric is fidelity to the unoptimized model.

    ``evaluation()`` pairs each input batch with the unoptimized model's output
    on it, computed once (on the first call) by ``targets`` (default: run
    ``build()`` on the CPU). The metric is ``metric`` if given, else the
    primary fidelity metric for ``output_kind`` (``auto`` decides from the
    reference outputs; see :func:`infer_output_kind`); ``extra_metrics``
    default to the kind's other fidelity metrics. They reach the spec once
    :class:`ModelSpec` has an ``extra_metrics`` field.
    """
    if output_kind not in OUTPUT_KINDS:
        raise SpecError(f"unknown output kind '{output_kind}': choose one of {', '.join(OUTPUT_KINDS)}")

    @cache
    def labelled() -> tuple[LabelledBatch, ...]:
        inputs = list(evaluation_inputs())
        if not inputs:
            raise SpecError(f"model '{name}': the evaluation set is empty")
        references = targets(inputs) if targets is not None else reference_outputs(build(), inputs)
        return tuple(zip(inputs, references, strict=True))

    chosen = metric
    kind = output_kind
    if chosen is None:
        if kind == "auto":
            kind = infer_output_kind(labelled()[0][1])
        chosen, *others = fidelity_metrics(kind)
        if extra_metrics is None:
            extra_metrics = tuple(others)
    if "extra_metrics" in {f.name for f in dataclasses.fields(ModelSpec)}:
        spec_fields["extra_metrics"] = extra_metrics or ()
    return ModelSpec(
        name=name,
        build=build,
        example_inputs=example_inputs,
        calibration=calibration,
        evaluation=lambda: list(labelled()),
        metric=chosen,
        output_kind=kind,
        **spec_fields,  # type: ignore[arg-type]
    )
