"""The ranking phase of a sensitivity calibration (:mod:`paretorch.stages.common.sensitivity`): each unit's
whole-model error when it alone is changed, or a block's when all its units are, descending only
into the blocks more sensitive than their siblings' mean; what was measured is kept when time runs out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from paretorch.pipeline.core.errors import InfeasibleConfig

#: ``measure(changed units, what) -> relative output error`` (raises :class:`UnitForwardError`).
MeasureFn = Callable[[Sequence[str], str], float]


class UnitForwardError(InfeasibleConfig):
    """The model's forward pass failed with some units changed."""


@dataclass
class PartialRanking:
    """The groups, sensitivities and unreducible units measured so far (kept when time runs out)."""

    stage: str
    change: str
    groups: list[tuple[str, ...]] = field(default_factory=list)
    sensitivity: dict[str, float] = field(default_factory=dict)
    unreducible: dict[str, str] = field(default_factory=dict)

    def add(self, group: tuple[str, ...], error: float) -> None:
        self.groups.append(group)
        self.sensitivity.update(dict.fromkeys(group, error))

    def rank_flat(self, candidates: Sequence[str], measure: MeasureFn) -> None:
        """Every unit alone (growing a group over later siblings where one alone breaks the forward)."""
        for index, name in enumerate(candidates):
            if name in self.sensitivity or name in self.unreducible:
                continue
            group: tuple[str, ...] = (name,)
            error = try_measure(measure, group, f"with only {name} {self.change}")
            if isinstance(error, UnitForwardError):
                alone = error
                parent = name.rpartition(".")[0]
                later_siblings = [
                    unit
                    for unit in candidates[index + 1 :]
                    if unit.rpartition(".")[0] == parent and unit not in self.sensitivity
                    and unit not in self.unreducible
                ]
                # Grow the group over the following siblings until the forward runs.
                for sibling in later_siblings:
                    group = (*group, sibling)
                    error = try_measure(measure, group, f"with {', '.join(group)} {self.change}")
                    if not isinstance(error, UnitForwardError):
                        break
                if isinstance(error, UnitForwardError):
                    self.unreducible[name] = alone.reason
                    continue
            self.add(group, error)

    def rank_blocks(self, units: list[str], depth: int, measure: MeasureFn) -> None:
        """Measure the blocks of ``units`` at name depth ``depth`` (``encoder.layer.3`` at
        depth 2); descend into those above their siblings' mean, keep the others as groups."""
        blocks = _blocks_at(units, depth)
        if len(blocks) == 1 and len(units) > 1:
            self.rank_blocks(units, depth + 1, measure)
            return
        errors: dict[str, float | UnitForwardError] = {}
        siblings: list[float] = []
        for key, members in blocks.items():
            if len(members) == 1:
                self.rank_flat(members, measure)
                siblings.extend(self.sensitivity[m] for m in members if m in self.sensitivity)
            else:
                errors[key] = error = try_measure(measure, tuple(members), f"with block {key} {self.change}")
                if isinstance(error, float):
                    siblings.append(error)
        finite = [e for e in siblings if math.isfinite(e)]
        mean = sum(finite) / len(finite) if finite else 0.0
        for key, error in errors.items():
            members = blocks[key]
            if isinstance(error, UnitForwardError) or not error <= mean:
                self.rank_blocks(members, depth + 1, measure)
            else:
                self.add(tuple(members), error)


def _blocks_at(units: Sequence[str], depth: int) -> dict[str, list[str]]:
    blocks: dict[str, list[str]] = {}
    for unit in units:
        blocks.setdefault(".".join(unit.split(".")[: depth + 1]), []).append(unit)
    return blocks


def try_measure(measure: MeasureFn, group: Sequence[str], what: str) -> float | UnitForwardError:
    try:
        return measure(group, what)
    except UnitForwardError as exc:
        return exc
