"""Fixtures of the search tests: ``tag_stage``, a test-only stage that labels the model for a fake clock and
changes nothing it computes (a no-op plugin stage), registered with :func:`pipeline.core.stage.registered`."""

from __future__ import annotations

import io
from pathlib import Path

import optuna
import pytest
import torch
from rich.console import Console
from torch import nn

from pipeline.core.paired import RoundTimer
from pipeline.core.spec import ModelSpec
from pipeline.core.stage import Stage, StageConfig, StageContext
from pipeline.search import Search, SearchConfig, run_search


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


def run_on_fake_clock(spec: ModelSpec, config: SearchConfig, folder: Path, timer: RoundTimer, trials: int) -> Search:
    """A search of ``spec`` timed on ``timer`` (no clock, no sleeping), its stores in ``folder``: the search with its
    ``outcome`` and console ``output`` attached (the stages it needs registered by the caller)."""
    search = Search(spec, torch.device("cpu"), config, storage=f"sqlite:///{folder / 'optuna.db'}",
                    tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    search.latency.timer = timer
    search.latency.cpu_clock = None
    output = io.StringIO()
    search.outcome = run_search(search, trials=trials, console=Console(file=output, width=400))  # type: ignore[attr-defined]
    search.output = output.getvalue()  # type: ignore[attr-defined]
    return search


def trials_by_seed(search: Search) -> dict[str, optuna.trial.FrozenTrial]:
    """The trials of a search run by :func:`run_on_fake_clock`, by seed name."""
    return {t.user_attrs.get("paretorch.seed"): t for t in search.outcome.study.trials}  # type: ignore[attr-defined]
