"""Fidelity floors: a label-free condition a spec sets beside its task metric.

A task metric can be a proxy with a blind spot. MiniLM's shipped task (human word
similarity) stays within 1 % after depth pruning + distillation while a human-labelled
*sentence* score drops 2.3 % (``experiments/bench/fidelity_check.py``). A floor closes that
gap: a trial is feasible only when its task metric is within the allowed drop **and** each
floor metric is at least its floor (:meth:`paretorch.pipeline.search.objectives.Objectives.verdict`).

A floor metric is a fidelity metric (:mod:`paretorch.pipeline.core.fidelity`) computed on rows of its
own, appended to the evaluation, against the unoptimized model's outputs on those rows; it is
reported with the trial's extra metrics under its own name. The task's metrics see only the
task's rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.spec import Batch, FidelityFloor, LabelledBatch, Metric, ModelSpec, split_batches


def floor_failures(spec: ModelSpec, extras: Mapping[str, float], allowed_share: float | None = None) -> list[str]:
    """Every fidelity floor of ``spec`` that ``extras`` (a trial's extra metrics) fail, in words, at an allowed
    drop of ``allowed_share`` of the baseline task metric (:meth:`FidelityFloor.at`; None: the floors as set)."""
    return [reason for floor in spec.fidelity_floors if (reason := floor.failure(extras, allowed_share)) is not None]


def _rows_of(metric: Metric, part: Callable[[Tensor], Tensor]) -> Metric:
    """``metric`` (and its bootstrap resamples) computed on ``part`` of the outputs and targets."""

    def compute(outputs: Tensor, targets: Tensor) -> Tensor:
        return metric.compute(part(outputs), part(targets))

    def on_part(resampled: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
        return lambda outputs, targets: resampled(part(outputs), part(targets))

    return dataclasses.replace(metric, compute=compute,
                               resampled=None if metric.resampled is None else on_part(metric.resampled))


def with_fidelity_floor(spec: ModelSpec, inputs: Batch, fidelity: Metric, name: str, floor: float, why: str,
                        batch_size: int = 32, share: float = 0.01, texts: Sequence[str] = ()) -> ModelSpec:
    """``spec`` whose evaluation also runs ``inputs`` and reports ``fidelity`` on them, against the
    unoptimized model's outputs, as the extra metric ``name``, with the floor ``floor`` calibrated for an
    allowed drop of ``share`` of the baseline task metric (raised toward the metric's best value, its upper
    bound, for a stricter one: :meth:`FidelityFloor.at`). ``texts``: the text of each row of ``inputs`` (its rows are
    named by them among a trial's worst inputs, after the task's own rows)."""
    if not fidelity.higher_is_better or fidelity.bounds is None:
        raise SpecError(f"model '{spec.name}': a fidelity floor needs a metric where higher is better with an upper "
                        f"bound (its value for an unchanged model); {fidelity.name} has none")
    perfect = fidelity.bounds[1]
    taken = {spec.metric.name, *(m.name for m in spec.extra_metrics)}
    if name in taken:
        raise SpecError(f"model '{spec.name}': the floor metric '{name}' is already one of its metrics")
    task: list[LabelledBatch] = list(spec.evaluation())
    task_rows = sum(int(targets.shape[0]) for _, targets in task)
    batches = split_batches(inputs, batch_size)
    rows = [(batch, torch.full((int(batch[0].shape[0]),), -1, dtype=torch.int64)) for batch in batches]

    def reference() -> Tensor:
        return spec.unoptimized_outputs.of(batches)

    def on_floor_rows(outputs: Tensor, _targets: Tensor) -> Tensor:
        return fidelity.compute(outputs[task_rows:], reference().to(outputs.device))

    def task_part(values: Tensor) -> Tensor:
        return values[:task_rows]

    return dataclasses.replace(
        spec,
        evaluation=lambda: [*task, *rows],
        metric=_rows_of(spec.metric, task_part),
        extra_metrics=(*(_rows_of(m, task_part) for m in spec.extra_metrics),
                       dataclasses.replace(fidelity, name=name, compute=on_floor_rows, resampled=None)),
        fidelity_floors=(*spec.fidelity_floors, FidelityFloor(name, floor, why, share, perfect)),
        evaluation_texts=(*spec.evaluation_texts, *texts) if len(spec.evaluation_texts) == task_rows else (),
    )
