"""The float fallback's refinement: blocks moved back whole are split again, layer by layer."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from paretorch.stages.common.sensitivity import calibrate

#: What changing each unit costs: the whole-model relative output error adds up exactly.
COSTS = {"a.0.p": 0.001, "a.0.q": 0.001, "a.0.fragile": 0.5, "a.1.p": 0.004, "a.1.fragile": 0.02}
BUDGET = 0.01


class Additive(nn.Module):
    """``x * (1 + sum of the changed units' costs)``: its relative output error is that sum."""

    def __init__(self) -> None:
        super().__init__()
        self.changed: set[str] = set()

    def forward(self, x: Tensor) -> Tensor:
        return x * (1.0 + sum(COSTS[unit] for unit in self.changed))


class AdditiveSwitch:
    def __init__(self) -> None:
        self.model = Additive()

    def set_changed(self, names: Iterable[str]) -> None:
        self.model.changed = set(names)


def run(refine: bool) -> tuple[set[str], float, tuple[str, ...]]:
    switch = AdditiveSwitch()
    result = calibrate(switch, list(COSTS), [(torch.ones(4, 3),)], BUDGET, stage="test", blocks=True, refine=refine)
    assert switch.model.changed == set(result.changed)  # the switch is left in the chosen policy
    return set(COSTS) - set(result.changed), result.output_error, result.refined


def test_without_refinement_a_block_goes_back_whole() -> None:
    kept, error, refined = run(refine=False)
    # a.1 was ranked as one block (below its sibling's error) and moved back whole
    assert kept == {"a.0.fragile", "a.1.p", "a.1.fragile"} and refined == ()
    assert abs(error - 0.002) < 1e-6


def test_refinement_changes_the_robust_layer_of_a_kept_block_again() -> None:
    kept, error, refined = run(refine=True)
    assert kept == {"a.0.fragile", "a.1.fragile"} and refined == ("a.1.p",)
    assert abs(error - 0.006) < 1e-6 and error <= BUDGET
