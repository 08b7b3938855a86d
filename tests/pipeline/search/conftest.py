"""Fixtures of the search tests: ``tag_stage``, a test-only stage that labels the model for a fake clock and
changes nothing it computes (a no-op plugin stage), registered with :func:`pipeline.core.stage.registered`."""

from __future__ import annotations

import optuna
import pytest
from torch import nn

from pipeline.core.stage import Stage, StageConfig, StageContext


class TagConfig(StageConfig):
    """Labels the model (``paretorch_label``) and leaves its numbers as they are."""

    stage = "toy.tag"
    label: str = "quiet"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> TagConfig | None:
        return None


def apply_tag(model: nn.Module, config: TagConfig, ctx: StageContext) -> nn.Module:
    model.paretorch_label = config.label  # type: ignore[assignment]
    return model


@pytest.fixture(scope="session")
def tag_stage() -> Stage:
    """The ``toy.tag`` stage: ``{"stage": "toy.tag", "label": ...}`` names the model ``label`` for a fake clock."""
    return Stage(TagConfig, apply_tag)
