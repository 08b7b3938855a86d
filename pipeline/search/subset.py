"""Evaluation at the fidelity the decision needs: a trial scored on a subset of the evaluation data first.

For a metric whose rows are units of their own (:attr:`paretorch.pipeline.core.spec.Metric.rowwise`: accuracy), the
first evaluation batches holding :data:`SUBSET_SHARE` of the rows (at least :data:`SUBSET_MIN_ROWS`) score the trial and
the unoptimized model alike, and the paired bootstrap (:mod:`paretorch.pipeline.core.bootstrap`) gives the drop's 95 %
interval on them. A trial whose interval lies wholly above the allowed drop cannot be feasible, nor one whose inputs
broke past the tail guard's limit with confidence
(:meth:`paretorch.pipeline.core.input_agreement.TailGuard.subset_failure`): it ends there, pruned with its subset drop
and the rows that decided it, and never gets the full evaluation. Every other trial is scored in full, so a front trial
always is. An evaluation set smaller than :data:`SUBSET_MIN_ROWS` /
:data:`SUBSET_SHARE` rows is scored in full at once (the subset would save little). The unoptimized model's subset
outputs are computed once per process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from paretorch.pipeline.core.bootstrap import drop_interval
from paretorch.pipeline.core.evaluate import evaluation_outputs, scoring_chunks
from paretorch.pipeline.core.input_agreement import InputAgreement, Reference, TailGuard
from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.spec import LabelledBatch, ModelSpec

#: The share of the evaluation rows a subset holds.
SUBSET_SHARE = 0.25
#: A subset holds at least this many rows (fewer: its interval decides nothing).
SUBSET_MIN_ROWS = 256
#: How a trial ended on its subset starts its reason.
OVER_ON_SUBSET = "over the allowed drop on a subset"


@dataclass(frozen=True)
class SubsetPlan:
    """The evaluation batches of the subset, and how many rows it and the whole set hold."""

    batches: list[LabelledBatch]
    rows: int
    total: int

    @property
    def fidelity(self) -> str:
        return f"subset {self.rows} of {self.total} rows"


def subset_plan(spec: ModelSpec, share: float = SUBSET_SHARE, min_rows: int = SUBSET_MIN_ROWS) -> SubsetPlan | None:
    """The first evaluation batches holding ``share`` of the rows (at least ``min_rows``); None where the metric
    is not rowwise or has no bootstrap, or where the set is too small for a subset to save anything."""
    if not spec.metric.rowwise or spec.metric.resampled is None:
        return None
    batches = spec.evaluation()
    total = sum(int(target.shape[0]) for _, target in batches)
    if total * share < min_rows:
        return None
    chosen: list[LabelledBatch] = []
    rows = 0
    for batch in batches:
        if rows >= max(min_rows, share * total):
            break
        chosen.append(batch)
        rows += int(batch[1].shape[0])
    return SubsetPlan(chosen, rows, total) if rows < total else None


@dataclass(frozen=True)
class SubsetVerdict:
    """A trial's drop on the subset, its 95 % interval, and why it ends there (None: it goes on)."""

    drop: float
    interval: tuple[float, float] | None
    fidelity: str
    over: str | None


class SubsetJudge:
    """Scores trials on one study's subset (see the module docstring)."""

    def __init__(self, spec: ModelSpec, device: torch.device, plan: SubsetPlan,
                 baseline: Callable[..., Tensor], tail: TailGuard | None = None,
                 reference: Callable[[], Reference] | None = None) -> None:
        self.spec = spec
        self.device = device
        self.plan = plan
        self._baseline = baseline
        #: The tail guard, checked on the subset too, by the study's :class:`Reference` (its output kind and
        #: cosine floor); either None: not checked.
        self.tail = tail if reference is not None else None
        self._study_reference = reference
        self._reference: tuple[float, Sequence[float], Tensor] | None = None

    def _score(self, fn: Callable[..., Tensor], runtime: str, batch_size: int) -> tuple[float, list[float], Tensor]:
        chunk, mask = scoring_chunks(self.spec, runtime, (batch_size,))
        outputs, targets = evaluation_outputs(fn, self.plan.batches, self.device, chunk, mask)
        metric = self.spec.metric
        assert metric.resampled is not None  # subset_plan checked it
        return (float(metric.compute(outputs, targets).item()), metric.resampled(outputs, targets).tolist(),
                outputs)

    def judge(self, fn: Callable[..., Tensor], runtime: str, batch_size: int, allowed: float) -> SubsetVerdict:
        """``fn`` (prepared for ``runtime``) against the unoptimized model on the subset, judged against the
        ``allowed`` absolute drop, and by the tail guard: its inputs against the unoptimized model's."""
        if self._reference is None:
            self._reference = self._score(self._baseline, DEFAULT_RUNTIME, batch_size)
        base_value, base_resamples, base_outputs = self._reference
        value, resamples, outputs = self._score(fn, runtime, batch_size)
        metric = self.spec.metric
        drop = metric.drop(base_value, value)
        interval = drop_interval(base_resamples, resamples, metric.higher_is_better)
        over = None
        if interval is not None and interval[0] > allowed:
            over = (f"{OVER_ON_SUBSET} ({self.plan.fidelity}): drop {drop:.4f} [{interval[0]:+.4f}, "
                    f"{interval[1]:+.4f}] > allowed {allowed:.4g}; not scored in full")
        elif self.tail is not None and self._study_reference is not None:
            study = self._study_reference()
            agreement = InputAgreement.of(outputs, base_outputs, study.output_kind, study.cosine_floor)
            over = self.tail.subset_failure(agreement, self.plan.fidelity)
        return SubsetVerdict(drop, interval, self.plan.fidelity, over)
