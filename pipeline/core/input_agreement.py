"""Per-input agreement with the unoptimized model: the distribution an aggregate metric hides.

A trial's metric is one number over the evaluation set. A recipe can keep it while it breaks a share of the
inputs (depth pruning of MiniLM leaves the word score up and some short sentences at cosine 0.45 to their fp32
embedding). So every trial is also compared with the unoptimized model input by input, on the rows of its
evaluation, by the output's kind:

* embeddings (and any output with more than one value per input): the cosine of each input's output to the
  unoptimized output (flattened per input); an input *breaks* below :data:`COSINE_FLOOR`;
* class logits: whether each input's top-1 class flipped; an input *breaks* when it flipped although the
  unoptimized model was confident (top-1 probability >= :data:`CONFIDENT`): a flip among near ties is noise of
  the data, a confident flip is damage;
* one value per input (a score, a regressor): the absolute error, reported by quantile; no input breaks (the
  units are the user's).

:class:`InputAgreement` holds the values; :meth:`InputAgreement.metrics` the few numbers a trial line, the table
and MLflow show (a low quantile, the share that broke); :meth:`InputAgreement.worst` names the worst inputs.
:class:`TailGuard` is the constraint (:meth:`paretorch.pipeline.search.objectives.Objectives.judge`): a recipe is
infeasible when more than ``limit`` of the inputs broke.

Why the defaults (``python -m paretorch.experiments.bench.tail_guard``, docs/metrics-and-task-data.md): on MiniLM's
evaluation rows int8 (dynamic and static), bf16, fp16 and pack keep every input above cosine 0.9, while the
depth-pruning family leaves several per cent of them below it; digits' int8 and bf16 flip no confident input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.fidelity import infer_output_kind
from paretorch.pipeline.core.tail_limit import COSINE_FLOOR, TAIL_LIMIT

#: What an input is compared by.
Measure = Literal["cosine", "flip", "abs_error"]
#: A class prediction counts as confident at this top-1 probability of the unoptimized model.
CONFIDENT = 0.9
#: The low quantile shown on the trial line (1st percentile).
LOW_QUANTILE = 0.01
#: The inputs named in a trial's files.
WORST_SHOWN = 20
#: A screen at low fidelity (fewer training steps) stops a trial past this many times the tail limit: the full
#: training may repair part of the tail.
SCREEN_FACTOR = 2.0
#: How a trial stopped on a subset of its inputs by the tail guard starts its reason.
TAIL_ON_SUBSET = "inputs broken on a subset"


def wilson_low(hits: int, count: int, z: float = 1.96) -> float:
    """Lower end of the Wilson score interval (95 % at the default ``z``) of a share ``hits / count``."""
    if count <= 0:
        return 0.0
    share = hits / count
    centre = share + z * z / (2 * count)
    spread = z * math.sqrt(share * (1 - share) / count + z * z / (4 * count * count))
    return max(0.0, (centre - spread) / (1 + z * z / count))

#: Extra-metric names (MLflow, the table): the low quantile and minimum of the per-input cosine, the share of
#: inputs that broke, and the abs-error quantiles of one-value outputs.
COSINE_P01, COSINE_P05, COSINE_MIN = "input_cosine_p01", "input_cosine_p05", "input_cosine_min"
BROKEN_SHARE = "inputs_broken_share"
FLIP_SHARE, CONFIDENT_SHARE = "input_flip_share", "inputs_confident_share"
ERROR_P95, ERROR_P99, ERROR_MAX = "input_abs_error_p95", "input_abs_error_p99", "input_abs_error_max"
#: The ones MLflow's runs view shows as columns (the others are logged under ``detail.``).
HEADLINE_INPUT_METRICS = (COSINE_P01, FLIP_SHARE, BROKEN_SHARE)
#: Every name above: what a trial reports besides its spec's metrics.
AGREEMENT_METRICS = (COSINE_P01, COSINE_P05, COSINE_MIN, BROKEN_SHARE, FLIP_SHARE, CONFIDENT_SHARE,
                     ERROR_P95, ERROR_P99, ERROR_MAX)


def measure_of(reference: Tensor, output_kind: str) -> Measure:
    """How inputs of this output are compared: ``flip`` for logits, ``abs_error`` for one value per input,
    ``cosine`` otherwise."""
    if reference.dim() <= 1 or reference[0].numel() == 1:
        return "abs_error"
    return "flip" if output_kind == "logits" else "cosine"


@dataclass(frozen=True)
class InputAgreement:
    """Each input's agreement with the unoptimized model (CPU, float32, one value per evaluation row).

    ``values``: cosine (``cosine``), 1.0 kept / 0.0 flipped (``flip``) or absolute error (``abs_error``);
    ``broken``: which inputs broke (see the module docstring); ``confident``: (``flip``) which inputs the
    unoptimized model was confident on."""

    measure: Measure
    values: Tensor
    broken: Tensor
    confident: Tensor | None = None
    floor: float = COSINE_FLOOR

    @classmethod
    def of(cls, outputs: Tensor, reference: Tensor, output_kind: str,
           floor: float = COSINE_FLOOR) -> InputAgreement:
        """Compare ``outputs`` with ``reference`` row by row (same shape; ``output_kind``: the spec's, resolved)."""
        if outputs.shape != reference.shape:
            raise SpecError(f"per-input agreement: outputs {tuple(outputs.shape)} and the unoptimized model's "
                            f"{tuple(reference.shape)} differ in shape")
        measure = measure_of(reference, output_kind)
        out = outputs.detach().float().reshape(outputs.shape[0], -1)
        ref = reference.detach().float().reshape(reference.shape[0], -1).to(out.device)
        if measure == "abs_error":
            errors = (out - ref).abs().amax(dim=1).cpu()
            return cls(measure, errors, torch.zeros_like(errors, dtype=torch.bool), floor=floor)
        if measure == "flip":
            kept = (out.argmax(dim=1) == ref.argmax(dim=1)).cpu()
            confident = (torch.softmax(ref, dim=1).amax(dim=1) >= CONFIDENT).cpu()
            return cls(measure, kept.float(), ~kept & confident, confident, floor)
        cosine = torch.nn.functional.cosine_similarity(out, ref, dim=1).cpu()
        # Two all-zero rows are the same output (cosine would read 0).
        same = (out == ref).all(dim=1).cpu()
        cosine = torch.where(same, torch.ones_like(cosine), cosine)
        return cls(measure, cosine, cosine < floor, floor=floor)

    @property
    def count(self) -> int:
        return int(self.values.numel())

    @property
    def broken_share(self) -> float:
        """Share of the inputs that broke."""
        return float(self.broken.float().mean()) if self.count else 0.0

    def quantile(self, q: float) -> float:
        return float(torch.quantile(self.values.double(), q)) if self.count else float("nan")

    def metrics(self) -> dict[str, float]:
        """The numbers a trial reports (names: :data:`AGREEMENT_METRICS`)."""
        if self.measure == "cosine":
            return {COSINE_P01: self.quantile(LOW_QUANTILE), COSINE_P05: self.quantile(0.05),
                    COSINE_MIN: float(self.values.min()), BROKEN_SHARE: self.broken_share}
        if self.measure == "flip":
            confident = self.confident if self.confident is not None else torch.zeros_like(self.broken)
            return {FLIP_SHARE: 1.0 - float(self.values.mean()), CONFIDENT_SHARE: float(confident.float().mean()),
                    BROKEN_SHARE: self.broken_share}
        return {ERROR_P95: self.quantile(0.95), ERROR_P99: self.quantile(0.99), ERROR_MAX: float(self.values.max())}

    def worst(self, k: int = WORST_SHOWN, texts: Sequence[str] = ()) -> list[dict[str, object]]:
        """The ``k`` inputs that agree least (broken first), worst first: index, value, and text where known."""
        if self.measure == "flip":  # the confident flips first, then the other flips
            order = sorted(range(self.count), key=lambda i: (not bool(self.broken[i]), float(self.values[i]), i))
        else:
            order = self.values.argsort(descending=self.measure == "abs_error", stable=True).tolist()
        rows: list[dict[str, object]] = []
        for index in order[:k]:
            if self.measure == "flip" and self.values[index] == 1.0:
                break  # only flips are worth naming
            row: dict[str, object] = {"index": index, self.measure: round(float(self.values[index]), 6),
                                      "broken": bool(self.broken[index])}
            if index < len(texts):
                row["text"] = texts[index]
            rows.append(row)
        return rows


def cell(metrics: Mapping[str, float]) -> str:
    """A trial's per-input view in a few characters (the table's cell; empty when none was measured):
    ``p01 cos 0.962, 0.0 % broken`` (embeddings), ``flips 0.3 %, confident 0.0 %`` (classes)."""
    broken = f"{100 * metrics.get(BROKEN_SHARE, 0.0):.1f} %"
    if COSINE_P01 in metrics:
        return f"p01 cos {metrics[COSINE_P01]:.3f}, {broken} broken"
    if FLIP_SHARE in metrics:
        return f"flips {100 * metrics[FLIP_SHARE]:.1f} %, confident {broken}"
    if ERROR_P99 in metrics:
        return f"p99 |err| {metrics[ERROR_P99]:.3g}"
    return ""


def describe(metrics: Mapping[str, float]) -> str:
    """The trial line's part: ``inputs: p01 cos 0.962, 0.0 % broken`` (empty when none was measured)."""
    text = cell(metrics)
    return f"inputs: {text}" if text else ""


@dataclass(frozen=True)
class Reference:
    """The unoptimized model's outputs on a spec's evaluation rows (in row order), what every trial is compared
    with input by input: computed once per study (the pass its self-check and baseline read)."""

    outputs: Tensor
    output_kind: str
    cosine_floor: float = COSINE_FLOOR

    @classmethod
    def of(cls, outputs: Tensor, output_kind: str, cosine_floor: float = COSINE_FLOOR) -> Reference:
        """The unoptimized ``outputs``, their kind resolved (``auto``: decided from them, as fidelity decides)."""
        kind = output_kind if output_kind != "auto" else infer_output_kind(outputs)
        return cls(outputs, kind, cosine_floor)

    def compare(self, outputs: Tensor) -> InputAgreement:
        return InputAgreement.of(outputs, self.outputs, self.output_kind, self.cosine_floor)


@dataclass(frozen=True)
class TailGuard:
    """At most ``limit`` of the inputs may break (``cosine_floor``: where an embedding input breaks;
    ``limit`` None: the guard is off)."""

    limit: float | None = TAIL_LIMIT
    cosine_floor: float = COSINE_FLOOR

    def failure(self, metrics: Mapping[str, float], factor: float = 1.0) -> str | None:
        """Why a trial's metrics fail the guard (None: they pass, or nothing per input was measured). ``factor``:
        a screen at low fidelity stops a trial only past this many times the limit (:data:`SCREEN_FACTOR`)."""
        share = metrics.get(BROKEN_SHARE)
        if self.limit is None or share is None or share <= self.limit * factor:
            return None
        what = (f"below cosine {self.cosine_floor:g} to the unoptimized outputs" if COSINE_P01 in metrics
                else "with a confident prediction flipped")
        past = "" if factor == 1.0 else f", {factor:g}x it at low fidelity"
        return f"{100 * share:.1f} % of inputs {what} (tail limit {100 * self.limit:g} %{past})"

    def subset_failure(self, agreement: InputAgreement, rows: str) -> str | None:
        """Why a trial fails the guard on a subset of the inputs with confidence: the 95 % Wilson interval of its
        broken share lies above the limit (None: it may pass in full). ``rows``: which rows, in words."""
        if self.limit is None or not agreement.count:
            return None
        low = wilson_low(int(agreement.broken.sum()), agreement.count)
        if low <= self.limit:
            return None
        return (f"{TAIL_ON_SUBSET} ({rows}): {self.failure(agreement.metrics())}, at least {100 * low:.1f} % "
                "with 95 % confidence; not scored in full")
