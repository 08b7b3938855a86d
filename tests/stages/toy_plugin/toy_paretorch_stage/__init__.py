"""A third-party stage: the whole of it is this module plus one entry-point line.

``toy.scale_bias`` scales every bias of the model by ``factor`` (1.0 keeps the model
exact, so a search can keep it on without losing accuracy). It is structural (its effect
is in the float graph, so exports carry it) and sits between prune and quantize in the
default pipeline.
"""

from __future__ import annotations

from typing import Self

import optuna
import torch
from pydantic import Field
from torch import nn

from pipeline.core.stage import Stage, StageConfig, StageContext


class ScaleBiasConfig(StageConfig):
    """Multiply every bias by ``factor``."""

    stage = "toy.scale_bias"
    factor: float = Field(default=1.0, gt=0, le=2)

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """Always on in a search (the factor that keeps the model exact); None is never needed."""
        return cls(factor=trial.suggest_categorical("toy.scale_bias.factor", [1.0]))


def apply(model: nn.Module, config: ScaleBiasConfig, ctx: StageContext) -> nn.Module:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.mul_(config.factor)
    ctx.record("toy.scale_bias.factor", config.factor)
    return model


STAGE = Stage(ScaleBiasConfig, apply, order=20)
