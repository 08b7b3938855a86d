"""Is the metric at its noise floor? Said at the start of a study, before any trial is judged by it.

A metric can move by more than the allowed drop for reasons that are not the recipe: a second evaluation of the
unoptimized model moves it (a nondeterministic model, ties), bf16 rounding alone moves it (inputs whose top
classes are near ties flip on any perturbation), or most inputs are near ties to begin with. Then every verdict
within that margin is noise, and only labelled data of the user's (``--eval-data``) can judge. :func:`noise_floor`
checks the three, from what the study has already computed (the self-check's passes, the unoptimized model's
outputs) plus one bf16 pass over an evaluation of at most :data:`BF16_MAX_ROWS` rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.device import capabilities, cpu_bf16_is_fast
from paretorch.pipeline.core.evaluate import evaluation_outputs
from paretorch.pipeline.core.progress import phase
from paretorch.pipeline.core.spec import LabelledBatch, Metric, ModelSpec

#: A class prediction is a near tie when its top two probabilities are closer than this.
NEAR_TIE_MARGIN = 0.1
#: "Most inputs": the share of near ties that makes the metric noise.
NEAR_TIE_SHARE = 0.5
#: The bf16 pass runs over evaluations of at most this many rows (a larger one would delay the first trial).
BF16_MAX_ROWS = 4096
#: What the warning points to.
LABELLED_DATA_HINT = "give labelled data of your own task (--eval-data FILE; docs/metrics-and-task-data.md)"


def near_tie_share(logits: Tensor) -> float:
    """Share of rows whose two most probable classes are within :data:`NEAR_TIE_MARGIN` of each other."""
    if logits.dim() != 2 or logits.shape[1] < 2:
        return 0.0
    top = torch.softmax(logits.float(), dim=1).topk(2, dim=1).values
    return float(((top[:, 0] - top[:, 1]) < NEAR_TIE_MARGIN).float().mean())


def bf16_metric(model: nn.Module, batches: Sequence[LabelledBatch], metric: Metric, device: torch.device) -> float:
    """``metric`` of ``model`` run under bf16 autocast on ``device`` (the unoptimized model, rounded only). On a CPU
    where bf16 math is slow (:func:`~paretorch.pipeline.core.device.cpu_bf16_is_fast`: emulated without AVX512-BF16
    or AMX) its weights are rounded to bf16 and it runs in float32 instead: autocast there took all-mpnet-base-v2
    over 15 minutes on an AVX2 EPYC (one thread; its fp32 reference pass 2 minutes), all before trial 0."""
    rows = sum(int(target.shape[0]) for _, target in batches)
    if device.type == "cpu" and not cpu_bf16_is_fast():
        with phase(f"noise floor: the unoptimized model once with its weights rounded to bf16, in float32 ({rows} "
                   "rows; bf16 math is slow on this CPU)"), bf16_rounded_weights(model):
            outputs, targets = evaluation_outputs(model, batches, device)
    else:
        with (phase(f"noise floor: the unoptimized model once under bf16 rounding ({rows} rows)"),
              torch.autocast(device_type=device.type, dtype=torch.bfloat16)):
            outputs, targets = evaluation_outputs(model, batches, device)
    return float(metric.compute(outputs.float(), targets).item())


@contextlib.contextmanager
def bf16_rounded_weights(model: nn.Module) -> Iterator[None]:
    """``model``'s floating-point parameters rounded to bf16 (kept float32) inside the block, restored after."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for param in params:
                param.copy_(param.to(torch.bfloat16))
        yield
    finally:
        with torch.no_grad():
            for param, kept in zip(params, saved, strict=True):
                param.copy_(kept)


@dataclass(frozen=True)
class NoiseFloor:
    """What moves the metric besides the recipe, against the allowed drop (absolute)."""

    allowed: float
    #: How far a second, re-batched evaluation moved it (the self-check's spread).
    second_evaluation: float
    #: How far bf16 rounding alone moved it (None: not measured).
    bf16: float | None
    #: Share of near-tie inputs (classifiers; 0 otherwise).
    near_ties: float

    def reasons(self) -> list[str]:
        reasons = []
        if self.second_evaluation > self.allowed:
            reasons.append(f"a second evaluation of the unoptimized model moves it by {self.second_evaluation:.4g}")
        if self.bf16 is not None and self.bf16 > self.allowed:
            reasons.append(f"bf16 rounding alone moves it by {self.bf16:.4g}")
        if self.near_ties >= NEAR_TIE_SHARE:
            reasons.append(f"{100 * self.near_ties:.0f} % of the inputs are near ties (top two classes within "
                           f"{NEAR_TIE_MARGIN:g} probability)")
        return reasons

    def line(self, metric: str) -> str | None:
        """The study's warning (None: the metric is above its noise floor)."""
        reasons = self.reasons()
        if not reasons:
            return None
        return (f"warning: {metric} is at its noise floor: {'; '.join(reasons)}, more than the allowed drop "
                f"{self.allowed:.4g}: verdicts within that margin are noise; {LABELLED_DATA_HINT}")

    def to_dict(self) -> dict[str, float | None]:
        return {"allowed": self.allowed, "second_evaluation": self.second_evaluation, "bf16": self.bf16,
                "near_ties": self.near_ties}


def noise_floor(model: nn.Module, spec: ModelSpec, device: torch.device, reference: tuple[Tensor, Tensor],
                output_kind: str, second_evaluation: float, allowed: float) -> NoiseFloor:
    """The noise floor of ``spec``'s metric on the unoptimized ``model``: ``reference``, its outputs and the targets
    over the evaluation; ``second_evaluation``: the self-check's spread; ``allowed``: the absolute allowed drop. The
    bf16 pass runs where the device runs bf16 at all (:func:`paretorch.pipeline.core.device.capabilities`)."""
    metric = spec.metric
    outputs, targets = reference
    base = float(metric.compute(outputs, targets).item())
    bf16 = None
    if int(outputs.shape[0]) <= BF16_MAX_ROWS and torch.bfloat16 in capabilities(device).reduced_dtypes:
        bf16 = abs(metric.drop(base, bf16_metric(model, spec.evaluation(), metric, device)))
    ties = near_tie_share(outputs) if output_kind == "logits" else 0.0
    return NoiseFloor(allowed, second_evaluation, bf16, ties)
