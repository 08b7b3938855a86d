"""The Optuna search over composed stages (see :mod:`paretorch.pipeline.search.study` for the trial objective).

One study per (model spec, search config), resumable from its storage; MLflow
tracking of every trial; the Pareto trials exported and logged at the end.
"""

from __future__ import annotations

from paretorch.pipeline.core.latency import LATENCY_BUDGETS
from paretorch.pipeline.search.config import (
    DEFAULT_SEARCH_CONFIG,
    Preset,
    SearchConfig,
    SeedRecipe,
    default_storage,
    make_sampler,
    study_name,
)
from paretorch.pipeline.search.loop import SearchOutcome, run_search
from paretorch.pipeline.search.search_times import SearchTimes
from paretorch.pipeline.search.study import Search

__all__ = [
    "DEFAULT_SEARCH_CONFIG",
    "LATENCY_BUDGETS",
    "Preset",
    "Search",
    "SearchConfig",
    "SearchOutcome",
    "SearchTimes",
    "SeedRecipe",
    "default_storage",
    "make_sampler",
    "run_search",
    "study_name",
]
