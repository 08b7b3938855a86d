"""Calibrate a precision policy: output error vs float32, per-layer sensitivity, greedy choice.

The **relative output error** of a model on the calibration batches ``B`` is

    error = sqrt( sum_b sum_k ||y_bk - r_bk||_2^2 ) / sqrt( sum_b sum_k ||r_bk||_2^2 )

where ``r_bk`` is the k-th floating tensor of the float32 model's output on batch
``b`` (outputs flattened with ``torch.utils._pytree``; integer outputs ignored)
and ``y_bk`` the same tensor of the mixed-precision model, cast to float32: the
Frobenius norm of the difference over all batches and outputs, relative to the
norm of the float32 outputs. A non-finite output gives ``inf``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from pipeline.core.errors import InfeasibleConfig, PipelineError
from pipeline.core.spec import Batch
from stages.amp.switch import PrecisionSwitch
from stages.amp.units import floating_output_leaves

#: The greedy phase re-measures the whole model at most this many times: bigger
#: models move ceil(groups / MAX_MOVES) groups back to float32 per step.
MAX_MOVES = 32
#: The sensitivity phase reads about this many full passes over the calibration batches
#: at most: a model with more candidates ranks them on its first batches only (the
#: budget is always checked on every batch).
SENSITIVITY_PASSES = 64


class PolicyForwardError(InfeasibleConfig):
    """The model's forward pass failed under some precision policy."""


@dataclass
class SensitivityRanking:
    """What calibration learns about one model, reduced dtype and set of calibration
    batches, whatever the error budget: reusable by a later calibration of the same
    model with another budget (:class:`RankingMemo`)."""

    #: The switchable groups in module order: single units, or siblings that must share a
    #: dtype because one alone broke the forward pass (e.g. the query, key and value
    #: projections that feed one attention op).
    groups: list[tuple[str, ...]]
    #: Whole-model error with each candidate's group alone reduced (group members share it).
    sensitivity: dict[str, float]
    #: Units that break the forward pass in the reduced dtype even with their siblings: float32.
    unreducible: dict[str, str]
    #: Whole-model error over all batches with the ``k`` most sensitive groups moved back
    #: to float32, for each ``k`` measured so far.
    errors: dict[int, float] = field(default_factory=dict)

    def ranked(self) -> list[tuple[str, ...]]:
        """The groups, most sensitive first; module order breaks ties (deterministic)."""
        order = sorted(range(len(self.groups)), key=lambda i: (-_sortable(self.sensitivity[self.groups[i][0]]), i))
        return [self.groups[i] for i in order]


class RankingMemo:
    """The last ``capacity`` rankings by key (least recently used dropped first)."""

    def __init__(self, capacity: int = 32) -> None:
        self.capacity = capacity
        self._rankings: OrderedDict[Hashable, SensitivityRanking] = OrderedDict()

    def get(self, key: Hashable) -> SensitivityRanking | None:
        ranking = self._rankings.get(key)
        if ranking is not None:
            self._rankings.move_to_end(key)
        return ranking

    def put(self, key: Hashable, ranking: SensitivityRanking) -> None:
        self._rankings[key] = ranking
        self._rankings.move_to_end(key)
        while len(self._rankings) > self.capacity:
            self._rankings.popitem(last=False)


@dataclass(frozen=True)
class CalibrationResult:
    """The chosen policy and how it was found."""

    fp32_units: tuple[str, ...]
    output_error: float
    ranking: SensitivityRanking
    #: ``(number of units moved back to float32, whole-model error)`` per step of the greedy phase.
    steps: list[tuple[int, float]] = field(default_factory=list)

    @property
    def sensitivity(self) -> dict[str, float]:
        return self.ranking.sensitivity

    @property
    def groups(self) -> list[tuple[str, ...]]:
        """The groups of more than one unit, in module order."""
        return [group for group in self.ranking.groups if len(group) > 1]

    @property
    def unreducible(self) -> dict[str, str]:
        return self.ranking.unreducible


def run_forward(model: nn.Module, batch: Batch, what: str) -> list[Tensor]:
    """The floating outputs of ``model(*batch)``; a failing forward is a :class:`PolicyForwardError`."""
    try:
        with torch.no_grad():
            return floating_output_leaves(model(*batch))
    except PipelineError:
        raise
    except Exception as exc:  # any error of a model's own forward: the policy cannot run here
        raise PolicyForwardError(f"amp: forward {what} failed: {type(exc).__name__}: {exc}") from exc


def reference_outputs(model: nn.Module, batches: Sequence[Batch]) -> list[list[Tensor]]:
    """The float32 model's floating outputs on every batch (detached, float32)."""
    reference = [[t.detach().float() for t in run_forward(model, batch, "of the float32 model")] for batch in batches]
    if not any(reference):
        raise InfeasibleConfig("amp: the model output has no floating tensor to compare against float32")
    return reference


def relative_output_error(
    model: nn.Module, batches: Sequence[Batch], reference: Sequence[Sequence[Tensor]], what: str = "in mixed precision"
) -> float:
    """The relative output error of ``model`` vs ``reference`` (module docstring)."""
    device = reference[0][0].device if reference and reference[0] else torch.device("cpu")
    diff_sq = torch.zeros((), device=device)
    ref_sq = torch.zeros((), device=device)
    for batch, expected in zip(batches, reference, strict=True):
        outputs = run_forward(model, batch, what)
        if len(outputs) != len(expected):
            raise PolicyForwardError(
                f"amp: the model gave {len(outputs)} floating outputs {what}, {len(expected)} in float32"
            )
        for output, ref in zip(outputs, expected, strict=True):
            diff_sq += (output.float() - ref).square().sum()
            ref_sq += ref.square().sum()
    num, den = math.sqrt(float(diff_sq.item())), math.sqrt(float(ref_sq.item()))
    if not math.isfinite(num):
        return math.inf
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def calibrate_policy(
    switch: PrecisionSwitch, batches: Sequence[Batch], error_budget: float, known: SensitivityRanking | None = None
) -> CalibrationResult:
    """Measure every candidate's sensitivity (whole-model error with that unit alone
    reduced; on the first batches only past :data:`SENSITIVITY_PASSES`), then start from
    every candidate reduced and move the most sensitive back to float32 until the
    whole-model error over all batches is within ``error_budget``.

    A unit whose forward breaks when it alone is reduced is tried together with the
    sibling units (same parent module) that follow it, one more at a time, until the
    forward runs; that group is then switched as one. If no such group runs, the unit
    stays float32. Leaves ``switch.model`` in the chosen policy.

    ``known``: the ranking of an earlier calibration of the same model, dtype and batches:
    its sensitivities and already measured greedy steps are reused (only steps it lacks
    are measured, and added to it), with the same result as calibrating afresh."""
    reference: list[list[Tensor]] = []

    def measure(reduced: Sequence[str], what: str, batch_count: int = len(batches)) -> float:
        if not reference:
            switch.set_reduced(())
            reference.extend(reference_outputs(switch.model, batches))
        switch.set_reduced(reduced)
        return relative_output_error(switch.model, batches[:batch_count], reference[:batch_count], what)

    ranking = known
    if ranking is None:
        candidates = switch.units.candidates
        ranking_batches = max(1, min(len(batches), len(batches) * SENSITIVITY_PASSES // max(1, len(candidates))))

        def measure_for_ranking(reduced: Sequence[str], what: str) -> float:
            return measure(reduced, what, ranking_batches)

        ranking = SensitivityRanking(*_group_sensitivities(candidates, measure_for_ranking))
    ranked = ranking.ranked()

    def error_with(moved: int) -> float:
        if moved not in ranking.errors:
            kept = len(_flatten(ranked[:moved]))
            what = f"with {kept} layers kept in float32" if moved else "with every layer reduced"
            ranking.errors[moved] = measure(_flatten(ranked[moved:]), what)
        return ranking.errors[moved]

    step = max(1, math.ceil(len(ranked) / MAX_MOVES))
    moved = 0
    error = error_with(0)
    steps = [(0, error)]
    while error > error_budget and moved < len(ranked):
        moved = min(len(ranked), moved + step)
        error = error_with(moved)
        steps.append((len(_flatten(ranked[:moved])), error))
    switch.set_reduced(_flatten(ranked[moved:]))
    return CalibrationResult(fp32_units=switch.fp32_units(), output_error=error, ranking=ranking, steps=steps)


def _group_sensitivities(
    candidates: Sequence[str], measure: Callable[[Sequence[str], str], float]
) -> tuple[list[tuple[str, ...]], dict[str, float], dict[str, str]]:
    """The switchable groups (single units, or siblings that must share a dtype), the
    sensitivity of every unit in them, and the units that cannot be reduced (with why)."""
    groups: list[tuple[str, ...]] = []
    sensitivity: dict[str, float] = {}
    unreducible: dict[str, str] = {}
    for index, name in enumerate(candidates):
        if name in sensitivity or name in unreducible:
            continue
        group: tuple[str, ...] = (name,)
        error = _try_measure(measure, group, f"with only {name} reduced")
        if isinstance(error, PolicyForwardError):
            alone = error
            parent = name.rpartition(".")[0]
            later_siblings = [
                unit
                for unit in candidates[index + 1 :]
                if unit.rpartition(".")[0] == parent and unit not in sensitivity and unit not in unreducible
            ]
            # Grow the group over the following siblings until the forward runs.
            for sibling in later_siblings:
                group = (*group, sibling)
                error = _try_measure(measure, group, f"with {', '.join(group)} reduced")
                if not isinstance(error, PolicyForwardError):
                    break
            if isinstance(error, PolicyForwardError):
                unreducible[name] = alone.reason
                continue
        groups.append(group)
        sensitivity.update(dict.fromkeys(group, error))
    return groups, sensitivity, unreducible


def _try_measure(
    measure: Callable[[Sequence[str], str], float], group: Sequence[str], what: str
) -> float | PolicyForwardError:
    try:
        return measure(group, what)
    except PolicyForwardError as exc:
        return exc


def _flatten(groups: Sequence[tuple[str, ...]]) -> list[str]:
    return [unit for group in groups for unit in group]


def _sortable(value: float) -> float:
    return math.inf if math.isnan(value) else value
