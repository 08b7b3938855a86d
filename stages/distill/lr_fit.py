"""A learning rate fitted to the model before it trains: a short range test from the config's rate downwards.

AdamW moves every weight by about the learning rate per step whatever its gradient's size, so a rate that suits a
transformer wrecks an already-trained CNN whose depthwise weights are of that order (top-1 agreement 1.0 -> 0.05
in 25 steps at 3.3e-4). :func:`fit_lr` tries the config's rate, then :data:`FIT_DIVISOR` times smaller, up to
:data:`FIT_CANDIDATES` rates: each for a few constant-rate steps from the same starting weights, scored by the probe
loss; the first whose loss ends at or below the start is the rate the run trains with. None keeps the loss down: the
model gains nothing from distillation here: the stage keeps it as it came and says why (:class:`NoRateHelps`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import InfeasibleConfig

#: Rates tried, from the config's downwards.
FIT_CANDIDATES = 4
#: Each rate is this many times smaller than the one before (half a decade).
FIT_DIVISOR = 10**0.5
#: Constant-rate steps per tried rate: a tenth of the run, within these bounds.
FIT_STEPS = (2, 5)
#: A loss this close above the start counts as not lowered (float noise of the probe).
TOLERANCE = 1e-6


class NoRateHelps(InfeasibleConfig):
    """No tried rate kept the loss at or below where it started."""


@dataclass(frozen=True)
class FittedRate:
    """The rate a run trains with and what the range test saw: (rate, probe loss after its steps) per rate tried."""

    lr: float
    tried: tuple[tuple[float, float], ...]
    steps: int


def fit_steps(steps: int) -> int:
    low, high = FIT_STEPS
    return max(low, min(high, steps // 10))


def candidates(lr: float) -> list[float]:
    return [lr / FIT_DIVISOR**i for i in range(FIT_CANDIDATES)]


def not_lowered(loss: float, start: float) -> bool:
    return loss > start * (1 + TOLERANCE) + TOLERANCE


def fit_lr(student: nn.Module, parameters: list[nn.Parameter], lr: float, steps: int, start_loss: float,
           step: Callable[[torch.optim.Optimizer, Tensor], object], indices: Callable[[], Iterator[Tensor]],
           probe: Callable[[], float], weight_decay: float) -> FittedRate:
    """The first of :func:`candidates` (``lr`` downwards) whose :func:`fit_steps` steps leave ``probe()`` at or below
    ``start_loss``; the student's weights are put back after each try. ``step(optimizer, index)`` runs one training
    step; ``indices()`` yields the run's batches. Raises :class:`NoRateHelps` when none does."""
    start = copy.deepcopy(student.state_dict())
    count = fit_steps(steps)
    tried: list[tuple[float, float]] = []
    try:
        for rate in candidates(lr):
            optimizer = torch.optim.AdamW(parameters, lr=rate, weight_decay=weight_decay)
            for _, index in zip(range(count), indices(), strict=False):
                step(optimizer, index)
            loss = probe()
            tried.append((rate, loss))
            student.load_state_dict(start)
            if not not_lowered(loss, start_loss):
                return FittedRate(rate, tuple(tried), count)
    finally:
        student.load_state_dict(start)
        for p in parameters:
            p.grad = None
    seen = ", ".join(f"{rate:.2g} -> {loss:.4g}" for rate, loss in tried)
    raise NoRateHelps(f"distill: no learning rate from {lr:.2g} down to {tried[-1][0]:.2g} kept the loss at or below "
                      f"its start ({start_loss:.4g}) over {count} steps ({seen}): this model gains nothing from "
                      "distillation here (leave distill out, or give it a lower lr with fit_lr: false)")
