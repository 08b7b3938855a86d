"""Per-layer sensitivity and a greedy float fallback to an output-error budget.

Shared by every stage that changes layers one by one and must keep the model within
an output-error budget: AMP (a layer in the reduced dtype) and quantize (a layer in
int8). A stage hands over a :class:`UnitSwitch` (a model whose candidate *units* can
each be put in the changed or the original form) and the calibration batches;
:func:`calibrate` measures each unit's **sensitivity** (the whole-model error when it
alone is changed), starts from every unit changed and moves the most sensitive back
to the original form until the error is within the budget.

The **relative output error** of a model on the calibration batches ``B`` is

    error = sqrt( sum_b sum_k ||y_bk - r_bk||_2^2 ) / sqrt( sum_b sum_k ||r_bk||_2^2 )

where ``r_bk`` is the k-th floating tensor of the original model's output on batch
``b`` (outputs flattened with ``torch.utils._pytree``; integer outputs ignored)
and ``y_bk`` the same tensor of the changed model, cast to float32: the Frobenius
norm of the difference over all batches and outputs, relative to the norm of the
original outputs. A non-finite output gives ``inf``.

Bounding the cost (so that calibration fits inside a search):

* ``blocks=True`` measures parent blocks first (every unit below ``encoder.layer.3``
  changed at once) and descends only into blocks more sensitive than the mean of
  their siblings; the others are switched as one group.
* :class:`~paretorch.stages.common.rankings.RankingStore` keeps what calibration learnt about one input model (the
  ranking and every greedy step measured) in memory and on disk, so later trials and
  resumed runs with any budget reuse it.
* ``seconds`` ends calibration with the best policy found so far: units not yet
  ranked count as the most sensitive (the first to go back), and the greedy phase
  stops at the first step that holds the budget or, when time runs out before one
  does, keeps every unit original (:attr:`CalibrationResult.cut_short`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import InfeasibleConfig, PipelineError
from paretorch.pipeline.core.progress import Phase, phase
from paretorch.pipeline.core.spec import Batch
from paretorch.stages.common.layer_outputs import floating_output_leaves
from paretorch.stages.common.partial_ranking import MeasureFn, PartialRanking, UnitForwardError, try_measure
from paretorch.stages.common.rankings import SensitivityRanking

#: The greedy phase re-measures the whole model at most this many times: bigger
#: models move ceil(groups / MAX_MOVES) groups back per step.
MAX_MOVES = 32
#: The sensitivity phase reads about this many full passes over the calibration batches
#: at most: a model with more candidates ranks them on its first batches only (the
#: budget is always checked on every batch).
SENSITIVITY_PASSES = 64


class UnitSwitch(Protocol):
    """A model whose candidate units can each be changed or kept original."""

    @property
    def model(self) -> nn.Module: ...

    def set_changed(self, names: Iterable[str]) -> None:
        """Change exactly ``names`` (candidates); every other unit in its original form."""




@dataclass(frozen=True)
class CalibrationResult:
    """The chosen policy and how it was found."""

    #: The candidate units left changed, in candidate order.
    changed: tuple[str, ...]
    output_error: float
    ranking: SensitivityRanking
    #: ``(number of units moved back, whole-model error)`` per step of the greedy phase.
    steps: list[tuple[int, float]] = field(default_factory=list)
    #: Why calibration ended before it finished (the time budget); None if it finished.
    cut_short: str | None = None
    #: Units not ranked before the time budget ran out (ranked most sensitive).
    unmeasured: tuple[str, ...] = ()
    #: Units the greedy phase had kept original (whole groups) that refinement changed again.
    refined: tuple[str, ...] = ()

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


def run_forward(model: nn.Module, batch: Batch, what: str, stage: str) -> list[Tensor]:
    """The floating outputs of ``model(*batch)``; a failing forward is a :class:`UnitForwardError`."""
    try:
        with torch.no_grad():
            return floating_output_leaves(model(*batch))
    except PipelineError:
        raise
    except Exception as exc:  # any error of a model's own forward: the policy cannot run here
        raise UnitForwardError(f"{stage}: forward {what} failed: {type(exc).__name__}: {exc}") from exc


def reference_outputs(model: nn.Module, batches: Sequence[Batch], stage: str) -> list[list[Tensor]]:
    """The original model's floating outputs on every batch (detached, float32)."""
    reference = [
        [t.detach().float() for t in run_forward(model, batch, "of the original model", stage)] for batch in batches
    ]
    if not any(reference):
        raise InfeasibleConfig(f"{stage}: the model output has no floating tensor to compare against")
    return reference


def relative_output_error(
    model: nn.Module, batches: Sequence[Batch], reference: Sequence[Sequence[Tensor]], what: str, stage: str
) -> float:
    """The relative output error of ``model`` vs ``reference`` (module docstring)."""
    device = reference[0][0].device if reference and reference[0] else torch.device("cpu")
    diff_sq = torch.zeros((), device=device)
    ref_sq = torch.zeros((), device=device)
    for batch, expected in zip(batches, reference, strict=True):
        outputs = run_forward(model, batch, what, stage)
        if len(outputs) != len(expected):
            raise UnitForwardError(
                f"{stage}: the model gave {len(outputs)} floating outputs {what}, {len(expected)} originally"
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


class _OutOfTime(Exception):
    """The time budget ran out before a measurement (internal control flow)."""


@dataclass
class _Clock:
    seconds: float | None
    start: float = field(default_factory=time.monotonic)

    def check(self) -> None:
        if self.seconds is not None and time.monotonic() - self.start > self.seconds:
            raise _OutOfTime

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def calibrate(
    switch: UnitSwitch,
    candidates: Sequence[str],
    batches: Sequence[Batch],
    error_budget: float,
    known: SensitivityRanking | None = None,
    *,
    stage: str,
    change: str = "changed",
    blocks: bool = False,
    seconds: float | None = None,
    refine: bool = False,
) -> CalibrationResult:
    """Rank ``candidates`` by sensitivity (on the first batches only past
    :data:`SENSITIVITY_PASSES`), then start from every candidate changed and move the
    most sensitive back until the whole-model error over all batches is within
    ``error_budget``. Leaves ``switch`` in the chosen policy.

    A unit whose forward breaks when it alone is changed is tried together with the
    sibling units (same parent module) that follow it, one more at a time, until the
    forward runs; that group is then switched as one. If no such group runs, the unit
    stays original. ``blocks``: rank parent blocks first (module docstring).

    ``known``: the ranking of an earlier calibration of the same model, change and
    batches: its sensitivities and already measured greedy steps are reused (only steps it
    lacks are measured, and added to it), with the same result as calibrating afresh.
    ``seconds``: the time budget (module docstring); ``stage`` and ``change`` word the
    error messages ("amp", "reduced").

    ``refine``: afterwards, try each unit kept original on its own, least sensitive first,
    and leave it changed when the whole-model error stays within the budget. Groups move
    back whole (a block at a time), so this splits them: fewer units stay original, for
    one measurement per kept unit (within the time budget; not kept by ``known``)."""
    reused = ", reusing an earlier ranking" if known is not None else ""
    with phase(f"{stage}: calibrating {len(candidates)} layers on {len(batches)} batches{reused}") as shown:
        return _calibrate(switch, candidates, batches, error_budget, known, shown,
                          (stage, change, blocks, seconds, refine))


def _calibrate(switch: UnitSwitch, candidates: Sequence[str], batches: Sequence[Batch], error_budget: float,
               known: SensitivityRanking | None, shown: Phase,
               options: tuple[str, str, bool, float | None, bool]) -> CalibrationResult:
    """:func:`calibrate`, its phase shown (the number of measurements so far on a terminal)."""
    stage, change, blocks, seconds, refine = options
    clock = _Clock(seconds)
    reference: list[list[Tensor]] = []

    def measure(changed: Sequence[str], what: str, batch_count: int = len(batches)) -> float:
        if not reference:
            switch.set_changed(())
            reference.extend(reference_outputs(switch.model, batches, stage))
        switch.set_changed(changed)
        shown.advance(note=f"{len(changed)} layers {change}")
        return relative_output_error(switch.model, batches[:batch_count], reference[:batch_count], what, stage)

    cut_short: str | None = None
    unmeasured: tuple[str, ...] = ()
    ranking = known
    if ranking is None:
        ranking_batches = max(1, min(len(batches), len(batches) * SENSITIVITY_PASSES // max(1, len(candidates))))

        def measure_for_ranking(changed: Sequence[str], what: str) -> float:
            clock.check()
            return measure(changed, what, ranking_batches)

        ranking, unmeasured, ran_out = _rank(candidates, blocks, measure_for_ranking, stage, change)
        if ran_out:
            cut_short = f"time budget of {seconds:g} s ran out while ranking ({len(unmeasured)} units not measured)"
    ranked = ranking.ranked()
    moved, error, steps, ran_out = _greedy(ranking, error_budget, measure, clock, change)
    if ran_out:
        cut_short = cut_short or f"time budget of {seconds:g} s ran out in the greedy phase"
    changed = _flatten(ranked[moved:])
    refined: list[str] = []
    if refine and cut_short is None:
        refined, error = _refine(changed, _flatten(ranked[:moved]), error, error_budget, measure, clock, change)
        changed += refined
    switch.set_changed(changed)
    return CalibrationResult(
        changed=tuple(unit for unit in candidates if unit in set(changed)),
        output_error=error,
        ranking=ranking,
        steps=steps,
        cut_short=cut_short,
        unmeasured=unmeasured,
        refined=tuple(refined),
    )


def _rank(candidates: Sequence[str], blocks: bool, measure: MeasureFn, stage: str,
          change: str) -> tuple[SensitivityRanking, tuple[str, ...], bool]:
    """The ranking of ``candidates`` (blocks first when ``blocks``), the units left unmeasured and whether
    time ran out; an unmeasured unit is ranked most sensitive, the first to go back."""
    partial = PartialRanking(stage, change)
    unmeasured: tuple[str, ...] = ()
    ran_out = False
    try:
        if blocks:
            partial.rank_blocks(list(candidates), 0, measure)
        else:
            partial.rank_flat(candidates, measure)
    except _OutOfTime:
        ran_out = True
        done = {unit for group in partial.groups for unit in group} | set(partial.unreducible)
        unmeasured = tuple(unit for unit in candidates if unit not in done)
        for unit in unmeasured:
            partial.add((unit,), math.inf)
    return SensitivityRanking(partial.groups, partial.sensitivity, partial.unreducible), unmeasured, ran_out


def _greedy(ranking: SensitivityRanking, error_budget: float, measure: MeasureFn, clock: _Clock,
            change: str) -> tuple[int, float, list[tuple[int, float]], bool]:
    """Move the most sensitive groups back, ``len / MAX_MOVES`` at a time, until the whole-model error is
    within ``error_budget``: (groups moved back, the error, [(units kept, error)] per step, whether time ran
    out). Measured steps are kept in ``ranking.errors`` and reused from it."""
    ranked = ranking.ranked()

    def error_with(moved: int) -> float:
        if moved not in ranking.errors:
            kept = len(_flatten(ranked[:moved]))
            what = f"with {kept} layers kept original" if moved else f"with every layer {change}"
            ranking.errors[moved] = measure(_flatten(ranked[moved:]), what)
        return ranking.errors[moved]

    step = max(1, math.ceil(len(ranked) / MAX_MOVES))
    moved = 0
    error = error_with(0)  # always measured: the policy must be checked against the budget
    steps = [(0, error)]
    ran_out = False
    while error > error_budget and moved < len(ranked):
        if moved + step not in ranking.errors:
            try:
                clock.check()
            except _OutOfTime:
                ran_out = True
                break
        moved = min(len(ranked), moved + step)
        error = error_with(moved)
        steps.append((len(_flatten(ranked[:moved])), error))
    if error > error_budget:  # cut short before the budget held: nothing changed is the only safe policy
        moved, error = len(ranked), 0.0
    return moved, error, steps, ran_out


def _refine(changed: Sequence[str], kept: Sequence[str], error: float, error_budget: float,
            measure: MeasureFn, clock: _Clock, change: str) -> tuple[list[str], float]:
    """The ``kept`` units (most sensitive first, so tried from the end) that can be changed on
    top of ``changed`` with the error still within the budget, and the error with them.
    Stops when time runs out."""
    refined: list[str] = []
    for unit in reversed(kept):
        try:
            clock.check()
        except _OutOfTime:
            break
        trial = try_measure(measure, (*changed, *refined, unit), f"with {unit} {change} as well")
        if isinstance(trial, float) and trial <= error_budget:
            refined.append(unit)
            error = trial
    return refined, error


def _flatten(groups: Sequence[tuple[str, ...]]) -> list[str]:
    return [unit for group in groups for unit in group]
