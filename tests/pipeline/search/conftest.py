"""Fixtures of the search tests: ``tag_stage``, a test-only stage that labels the model for a fake clock and
changes nothing it computes (a no-op plugin stage), registered with :func:`paretorch.pipeline.core.stage.registered`."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
import torch
from optuna_dashboard import wsgi
from rich.console import Console
from torch import nn

from paretorch.pipeline.core.paired import RoundTimer
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext
from paretorch.pipeline.search import Search, SearchConfig, run_search


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
    search.model.latency.timer = timer
    search.model.latency.cpu_clock = None
    output = io.StringIO()
    search.outcome = run_search(search, trials=trials, console=Console(file=output, width=400))  # type: ignore[attr-defined]
    search.output = output.getvalue()  # type: ignore[attr-defined]
    return search


def trials_by_seed(search: Search) -> dict[str, optuna.trial.FrozenTrial]:
    """The trials of a search run by :func:`run_on_fake_clock`, by seed name."""
    return {t.user_attrs.get("paretorch.seed"): t for t in search.outcome.study.trials}  # type: ignore[attr-defined]


def study_detail(storage: optuna.storages.BaseStorage, study_id: int) -> dict[str, Any]:
    """optuna-dashboard's own JSON of one study (its best trials, trial and study notes), as its pages read it."""
    environ: dict[str, Any] = {"PATH_INFO": f"/api/studies/{study_id}", "QUERY_STRING": "after=0",
                               "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(wsgi(storage)(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status[0].startswith("200"), status
    return dict(json.loads(body))
