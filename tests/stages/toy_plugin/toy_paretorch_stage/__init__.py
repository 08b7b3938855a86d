"""A third-party stage: the whole of it is this module plus one entry-point line.

``toy.scale_bias`` scales every bias of the model by ``factor``, ``repeats`` times (1.0 keeps
the model exact, so a search can keep it on without losing accuracy). A search samples it as a
realistic stage does: on or off, and an integer (``repeats``), so every suite run under the plugin
draws from the sampler's random stream differently than without it. It is structural (its effect
is in the float graph, so exports carry it) and sits between prune and quantize in the default
pipeline.
"""

from __future__ import annotations

from typing import Self

import optuna
import torch
from pydantic import Field
from torch import nn

from paretorch.extend import Stage, StageConfig, StageContext


class ScaleBiasConfig(StageConfig):
    """Multiply every bias by ``factor``, ``repeats`` times."""

    stage = "toy.scale_bias"
    factor: float = Field(default=1.0, gt=0, le=2)
    repeats: int = Field(default=1, ge=1, le=4)

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """On or off, and how many times (the factor that keeps the model exact)."""
        if not trial.suggest_categorical("toy.scale_bias.on", [True, False]):
            return None
        return cls(repeats=trial.suggest_int("toy.scale_bias.repeats", 1, 4))


def apply(model: nn.Module, config: ScaleBiasConfig, ctx: StageContext) -> nn.Module:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.mul_(config.factor**config.repeats)
    ctx.record("toy.scale_bias.factor", config.factor)
    return model


STAGE = Stage(ScaleBiasConfig, apply, order=20)
