"""What a resumed study says first about the trials it runs again.

A trial that did not finish is not a trial of the study: its configuration is enqueued once more (interrupted by
Ctrl-C: :func:`~paretorch.pipeline.search.storage.retry_trial`; its process died and left it RUNNING, a ``kill -9`` or a
lost machine: :func:`~paretorch.pipeline.search.storage.fail_dead_trials`), and the retry runs first.
:func:`rerun_lines` names each waiting retry's trial, its recipe and why, one line each:
``resuming: trial 7 (prune 0.3 | ort) is run again: its process died (left RUNNING)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.engine.recipe import configs_from_json
from paretorch.pipeline.engine.short_recipe import short_recipe
from paretorch.pipeline.search.objectives import ATTR_CONFIGS, ATTR_RUNTIME, ATTR_SEED
from paretorch.pipeline.search.storage import ATTR_RERUN, DIED


def rerun_lines(trials: Sequence[FrozenTrial]) -> list[str]:
    """One line per waiting retry among ``trials`` (the study's): the trial it runs again and why."""
    return [rerun_line(t) for t in trials if t.state == TrialState.WAITING and t.system_attrs.get("retry_history")]


def rerun_line(retry: FrozenTrial) -> str:
    """``resuming: trial N (<recipe>) is run again: <why>``, N the trial before ``retry`` (the last it retries)."""
    number = retry.system_attrs["retry_history"][-1]
    return f"resuming: trial {number} ({asked(retry)}) is run again: {retry.user_attrs.get(ATTR_RERUN, DIED)}"


def asked(trial: FrozenTrial) -> str:
    """The recipe a trial asked for, short (its seed's name where it recorded none: a study of an older version)."""
    attrs = trial.user_attrs
    if ATTR_CONFIGS in attrs and ATTR_RUNTIME in attrs:
        return short_recipe(configs_from_json(attrs[ATTR_CONFIGS]).values(), str(attrs[ATTR_RUNTIME]))
    return str(attrs.get(ATTR_SEED) or "its sampled parameters")
