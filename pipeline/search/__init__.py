"""The Optuna search over composed stages (see :mod:`paretorch.pipeline.search.study` for the trial objective).

One study per (model spec, search config), resumable from its storage; MLflow
tracking of every trial; the Pareto trials exported and logged at the end.

The names below load on first use (``from paretorch.pipeline.search import Search`` imports the study then):
the study imports torch, Optuna and MLflow, and ``python -m paretorch`` validates a search config with
:mod:`paretorch.pipeline.search.schema` before that, which importing this package must not run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for type checkers and the import contracts
    from paretorch.pipeline.core.latency import LATENCY_BUDGETS as LATENCY_BUDGETS
    from paretorch.pipeline.search.config import DEFAULT_SEARCH_CONFIG as DEFAULT_SEARCH_CONFIG
    from paretorch.pipeline.search.config import Preset as Preset
    from paretorch.pipeline.search.config import SearchConfig as SearchConfig
    from paretorch.pipeline.search.config import SeedRecipe as SeedRecipe
    from paretorch.pipeline.search.config import default_storage as default_storage
    from paretorch.pipeline.search.config import make_sampler as make_sampler
    from paretorch.pipeline.search.config import study_name as study_name
    from paretorch.pipeline.search.loop import SearchOutcome as SearchOutcome
    from paretorch.pipeline.search.loop import run_search as run_search
    from paretorch.pipeline.search.study import Search as Search
    from paretorch.pipeline.search.time_to_result import SearchTimes as SearchTimes

#: The module each public name is loaded from.
HOMES = {
    "DEFAULT_SEARCH_CONFIG": "paretorch.pipeline.search.config",
    "LATENCY_BUDGETS": "paretorch.pipeline.core.latency",
    "Preset": "paretorch.pipeline.search.config",
    "Search": "paretorch.pipeline.search.study",
    "SearchConfig": "paretorch.pipeline.search.config",
    "SearchOutcome": "paretorch.pipeline.search.loop",
    "SearchTimes": "paretorch.pipeline.search.time_to_result",
    "SeedRecipe": "paretorch.pipeline.search.config",
    "default_storage": "paretorch.pipeline.search.config",
    "make_sampler": "paretorch.pipeline.search.config",
    "run_search": "paretorch.pipeline.search.loop",
    "study_name": "paretorch.pipeline.search.config",
}
__all__ = sorted(HOMES)


def __getattr__(name: str) -> Any:
    """``paretorch.pipeline.search.<name>``: the name from its module (:data:`HOMES`), imported on first use."""
    if name not in HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(HOMES[name]), name)
    globals()[name] = value  # found directly from now on
    return value
