"""Fidelity metrics: how closely a model's outputs follow the unoptimized model's.

For a model without labels (an embedding model, a TorchScript file, a regressor)
the targets of the evaluation set are the *unoptimized* model's outputs on the
same inputs, and the metric compares the optimized model's outputs to them:

* classifiers (logits over classes): :data:`TOP1_AGREEMENT` (primary; share of
  inputs whose arg-max class is unchanged) and :data:`KL_DIVERGENCE`
  (mean KL(reference || optimized) of the softmax distributions, in nats);
* embeddings and regressors: :data:`MEAN_COSINE` (primary; mean cosine
  similarity per sample), then two metrics of use rather than identity:
  :data:`PAIRWISE_RANK_CORRELATION` (Spearman between the pairwise cosine
  similarities of outputs and of targets: similarity ranking) and
  :data:`NEIGHBOUR_OVERLAP_AT_10` (share of each sample's ten nearest neighbours
  kept: retrieval), and :data:`SQNR_DB` (signal-to-quantization-noise
  ratio over the whole output, in dB, clamped to +-:data:`SQNR_CAP_DB`);
* one value per sample (a score, a regressor; cosine would always be 1):
  :data:`OUTPUT_R2` (primary) and :data:`MEAN_ABS_ERROR` (:data:`SCALAR_METRICS`);
* embeddings used for retrieval: :data:`NEIGHBOUR_AGREEMENT`.

Every ``compute(outputs, targets)`` runs on the device and returns a 0-dim
tensor, as :class:`paretorch.pipeline.core.spec.Metric` requires. :func:`fidelity_spec` turns a
model plus unlabelled input batches into a :class:`ModelSpec` whose targets are
computed once, on the CPU, by the unoptimized model.

Why mean cosine is the embedding default: ``python -m paretorch.experiments.bench.fidelity_check``
built 10 MiniLM variants with the project's stages (int8 / int4 quantization,
unstructured, FFN, head and depth pruning, with and without distillation) and scored
each on 1,500 human-labelled sentence pairs (STS benchmark dev; fp32 86.72, Spearman
x 100) and by fidelity to fp32 on the same 2,910 sentences (BENCHMARKS.md, last
section). Across the variants, mean cosine tracked the human score best (Spearman 0.855,
Pearson 0.887), then neighbour agreement (0.830 / 0.880), pairwise rank correlation
(0.818 / 0.851) and neighbour overlap@10 (0.818 / 0.773); every metric put all the variants
within 1 % of fp32's human score above all the others, and mean cosine gave those
"as good" variants the highest values (lowest 0.869, against 0.800 pairwise and 0.692
overlap@10), i.e. it is the least conservative. The differences rest on 10 variants
(one or two swaps), so the use metrics are reported next to it, not instead.

Fidelity is conservative (:func:`fidelity_note`): unstructured pruning at 0.3 scored
*above* fp32 on the human pairs (87.21) at mean cosine 0.934, pairwise 0.898 and
overlap@10 0.787. Labelled data (``--eval-data``) judges by the task instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import cache

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.ranking import spearman
from paretorch.pipeline.core.spec import OUTPUT_KINDS, Batch, LabelledBatch, Metric, ModelSpec, OutputKind
from paretorch.pipeline.core.unoptimized_outputs import UnoptimizedOutputs

# OUTPUT_KINDS / OutputKind: the one output-kind vocabulary lives in paretorch.pipeline.core.spec (the
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


#: :func:`pairwise_rank_correlation` compares at most this many pairs (a fixed, seeded sample above it).
MAX_PAIRS = 200_000
#: Seed of that sample: the same pairs for every model of a study.
PAIR_SEED = 0
#: Neighbours compared per sample by :func:`neighbour_overlap_at_10`.
OVERLAP_K = 10
#: Query rows per block when ranking neighbours (bounds the similarity block at this x N).
_NEIGHBOUR_BLOCK = 1024


def _unit_rows(tensor: Tensor) -> Tensor:
    return torch.nn.functional.normalize(_per_sample(tensor), dim=1)


def _undefined(outputs: Tensor, targets: Tensor, name: str, least: int) -> Tensor | None:
    """Check the shapes; NaN (undefined, not an error: a two-line ``--inputs-file`` still runs)
    when there are fewer than ``least`` samples, else None."""
    _check_shapes(outputs, targets, name)
    return torch.tensor(float("nan"), device=outputs.device) if outputs.shape[0] < least else None


def pair_indices(n: int, device: torch.device | str = "cpu", max_pairs: int = MAX_PAIRS,
                 seed: int = PAIR_SEED) -> tuple[Tensor, Tensor]:
    """The pairs ``(i, j)``, ``i != j``, that :func:`pairwise_rank_correlation` compares among ``n`` samples.

    Every pair of the upper triangle when there are at most ``max_pairs``; else ``max_pairs``
    pairs drawn uniformly (with replacement) by a CPU generator seeded with ``seed``: the same
    pairs on every call, device and model.
    """
    if n * (n - 1) // 2 <= max_pairs:
        rows, cols = torch.triu_indices(n, n, offset=1)
    else:
        generator = torch.Generator().manual_seed(seed)
        rows = torch.randint(0, n, (max_pairs,), generator=generator)
        cols = torch.randint(0, n - 1, (max_pairs,), generator=generator)
        cols = cols + (cols >= rows).long()  # skip i itself: j is uniform over the others
    return rows.to(device), cols.to(device)


def pairwise_rank_correlation(outputs: Tensor, targets: Tensor) -> Tensor:
    """Spearman correlation between the pairwise cosine similarities of the outputs and of the targets.

    Over the upper triangle of the two similarity matrices (a fixed sample of
    :data:`MAX_PAIRS` pairs above that: :func:`pair_indices`). 1.0 means that every pair
    of inputs is ranked as similar, relative to the other pairs, as the unoptimized model
    ranks it: what semantic similarity, clustering and retrieval read. Unchanged by
    any rotation or scaling of the embedding space. NaN with fewer than 3 samples.
    """
    if (nan := _undefined(outputs, targets, "pairwise_rank_correlation", 3)) is not None:
        return nan
    rows, cols = pair_indices(outputs.shape[0], outputs.device, MAX_PAIRS)
    out, ref = _unit_rows(outputs), _unit_rows(targets)
    return spearman((out[rows] * out[cols]).sum(dim=1), (ref[rows] * ref[cols]).sum(dim=1)).float()


def _top_neighbours(embeddings: Tensor, k: int) -> Tensor:
    """(N, k) indices of each row's k nearest other rows by cosine, nearest first."""
    unit = _unit_rows(embeddings)
    blocks = []
    for start in range(0, unit.shape[0], _NEIGHBOUR_BLOCK):
        similarity = unit[start : start + _NEIGHBOUR_BLOCK] @ unit.T
        own = torch.arange(start, start + similarity.shape[0], device=unit.device)
        similarity[torch.arange(similarity.shape[0], device=unit.device), own] = float("-inf")
        blocks.append(similarity.topk(k, dim=1).indices)
    return torch.cat(blocks)


def neighbour_overlap(outputs: Tensor, targets: Tensor, k: int = OVERLAP_K) -> Tensor:
    """Mean over samples of |top-k neighbours from the outputs ∩ top-k from the targets| / k.

    Neighbours by cosine among the other samples (self excluded); k is cut to N - 1. 1.0
    means every sample's k nearest inputs are the same set (in any order) as the
    unoptimized model's; 0.9, one in ten changed. NaN with fewer than 2 samples.
    """
    if (nan := _undefined(outputs, targets, "neighbour_overlap", 2)) is not None:
        return nan
    k = min(k, outputs.shape[0] - 1)
    found, expected = _top_neighbours(outputs, k), _top_neighbours(targets, k)
    shared = (found.unsqueeze(2) == expected.unsqueeze(1)).any(dim=2).sum(dim=1)
    return shared.float().mean() / k


def neighbour_overlap_at_10(outputs: Tensor, targets: Tensor) -> Tensor:
    """:func:`neighbour_overlap` with k = min(10, N - 1): the share of each sample's ten nearest
    inputs (by cosine, self excluded) that the unoptimized model also puts in its ten nearest."""
    return neighbour_overlap(outputs, targets, OVERLAP_K)


TOP1_AGREEMENT = Metric("top1_agreement", higher_is_better=True, compute=top1_agreement, bounds=(0.0, 1.0))
KL_DIVERGENCE = Metric("kl_divergence", higher_is_better=False, compute=kl_divergence)
MEAN_COSINE = Metric("mean_cosine", higher_is_better=True, compute=mean_cosine, bounds=(-1.0, 1.0))
SQNR_DB = Metric("sqnr_db", higher_is_better=True, compute=sqnr_db)
NEIGHBOUR_AGREEMENT = Metric("neighbour_agreement", higher_is_better=True, compute=neighbour_agreement,
                             bounds=(0.0, 1.0))
PAIRWISE_RANK_CORRELATION = Metric("pairwise_rank_correlation", higher_is_better=True,
                                   compute=pairwise_rank_correlation, bounds=(-1.0, 1.0))
NEIGHBOUR_OVERLAP_AT_10 = Metric("neighbour_overlap_at_10", higher_is_better=True, compute=neighbour_overlap_at_10,
                                 bounds=(0.0, 1.0))

#: Primary and extra fidelity metrics per output kind. Embeddings: mean cosine stays primary, as it
#: tracked a human-labelled score best in ``experiments/bench/fidelity_check.py`` (module docstring).
METRICS_BY_KIND: dict[str, tuple[Metric, ...]] = {
    "logits": (TOP1_AGREEMENT, KL_DIVERGENCE),
    "embedding": (MEAN_COSINE, PAIRWISE_RANK_CORRELATION, NEIGHBOUR_OVERLAP_AT_10, SQNR_DB),
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


# ---- one value per sample (a score, a probability, a regressor): cosine is meaningless there (always +-1)

#: :func:`output_r2` never goes below this (a constant or hopeless output), so that it stays a finite number.
R2_FLOOR = -1.0


def output_r2(outputs: Tensor, targets: Tensor) -> Tensor:
    """1 - sum (reference - output)^2 / sum (reference - mean of the reference)^2, over all values:
    the share of the reference's spread that the outputs reproduce (1 = identical, 0 = no better than
    the reference's mean), clamped to [:data:`R2_FLOOR`, 1]; a constant reference gives 1 if matched
    exactly, else the floor."""
    _check_shapes(outputs, targets, "output_r2")
    reference = targets.float()
    residual = (reference - outputs.float()).pow(2).sum()
    spread = (reference - reference.mean()).pow(2).sum()
    r2 = (1.0 - residual / spread).nan_to_num(nan=R2_FLOOR, neginf=R2_FLOOR).clamp(R2_FLOOR, 1.0)
    return torch.where(residual == 0, torch.ones_like(r2), r2)


def mean_abs_error(outputs: Tensor, targets: Tensor) -> Tensor:
    """Mean |output - reference| over all values, in the output's units (0 = identical)."""
    _check_shapes(outputs, targets, "mean_abs_error")
    return (outputs.float() - targets.float()).abs().mean()


OUTPUT_R2 = Metric("output_r2", higher_is_better=True, compute=output_r2, bounds=(R2_FLOOR, 1.0))
MEAN_ABS_ERROR = Metric("mean_abs_error", higher_is_better=False, compute=mean_abs_error)
#: Primary and extra fidelity metrics of an output with one value per sample ((batch,) or (batch, 1)).
SCALAR_METRICS: tuple[Metric, ...] = (OUTPUT_R2, MEAN_ABS_ERROR)


def one_value_per_sample(output: Tensor) -> bool:
    """True for a (batch,) or (batch, 1, ...) output: one number per sample."""
    return output.dim() <= 1 or output[0].numel() == 1


def default_fidelity_metrics(kind: str, output: Tensor) -> tuple[Metric, ...]:
    """:func:`fidelity_metrics` for ``kind``, except that an embedding-kind output with one value
    per sample gets :data:`SCALAR_METRICS`."""
    if kind == "embedding" and one_value_per_sample(output):
        return SCALAR_METRICS
    return fidelity_metrics(kind)


def fidelity_report(outputs: Tensor, targets: Tensor, metrics: Sequence[Metric]) -> dict[str, float]:
    """Every metric of ``metrics`` on the same outputs, as name -> number."""
    return {metric.name: float(metric.compute(outputs, targets).item()) for metric in metrics}


#: Names of the fidelity metrics: a spec scored by one of them compares with the unoptimized model, not labels.
FIDELITY_METRIC_NAMES: frozenset[str] = frozenset(
    metric.name for metric in (*(m for ms in METRICS_BY_KIND.values() for m in ms), NEIGHBOUR_AGREEMENT,
                               *SCALAR_METRICS)
)


def fidelity_note(metric: Metric) -> str | None:
    """One line saying that ``metric`` is fidelity, which is conservative, and how to judge by the task
    instead (``--eval-data``); None for any other metric."""
    if metric.name not in FIDELITY_METRIC_NAMES:
        return None
    return (f"metric: {metric.name} = fidelity to the unoptimized model (no labels). Fidelity is conservative: "
            "a model as good on your task can score lower. Pass --eval-data FILE with labelled data to judge "
            "by your task metric.")


def fidelity_spec(
    name: str,
    build: Callable[[], nn.Module],
    example_inputs: Callable[[int], Batch],
    calibration: Callable[[], Sequence[Batch]],
    evaluation_inputs: Callable[[], Sequence[Batch]],
    output_kind: str = "auto",
    metric: Metric | None = None,
    extra_metrics: tuple[Metric, ...] | None = None,
    **spec_fields: object,
) -> ModelSpec:
    """A :class:`ModelSpec` whose metric is fidelity to the unoptimized model.

    ``evaluation()`` pairs each input batch with the unoptimized model's output
    on it, computed once (on the first call) by the spec's
    :class:`UnoptimizedOutputs` (``build()`` on the CPU, unless a reader already ran
    the batch). The metric is ``metric`` if given, else the
    primary fidelity metric for ``output_kind`` (``auto`` decides from the
    reference outputs; see :func:`infer_output_kind`); ``extra_metrics``
    default to the kind's other fidelity metrics. They reach the spec once
    :class:`ModelSpec` has an ``extra_metrics`` field.
    """
    if output_kind not in OUTPUT_KINDS:
        raise SpecError(f"unknown output kind '{output_kind}': choose one of {', '.join(OUTPUT_KINDS)}")

    unoptimized = UnoptimizedOutputs(build)

    @cache
    def labelled() -> tuple[LabelledBatch, ...]:
        inputs = list(evaluation_inputs())
        if not inputs:
            raise SpecError(f"model '{name}': the evaluation set is empty")
        # The targets are the unoptimized outputs: the study's reference reads them, it does not run them again.
        rows = unoptimized.of(inputs).split([int(batch[0].shape[0]) for batch in inputs])
        return tuple(zip(inputs, rows, strict=True))

    chosen = metric
    kind = output_kind
    if chosen is None:
        if kind == "auto":  # the reference's shape decides (one value per sample: not cosine)
            kind = infer_output_kind(labelled()[0][1])
            chosen, *others = default_fidelity_metrics(kind, labelled()[0][1])
        else:
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
        unoptimized=unoptimized,
        **spec_fields,  # type: ignore[arg-type]
    )
