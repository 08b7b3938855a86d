"""Repeated recipes: samplers re-propose a (model stages, runtime) pair already measured.

A repeat is detected before it runs and ends as a pruned trial whose reason names the
trial that measured it (``repeat of trial N``). Pruning rather than copying the values:
a pruned trial has no objective values, so it can never appear on the front (nor twice
in ``study.best_trials``), it adds no duplicate points to the sampler's history (copied
values would pull a TPE sampler further towards the same recipe), and the original
trial stays the one place where the numbers, artifacts and exports live.
:class:`TrialBudget` counts trials without their repeats, so the study's budget is
spent on distinct recipes. :class:`Repeats` is the study's index of measured recipes, which the trial's rule-out
step and the proposals (:mod:`paretorch.pipeline.search.proposals`) both read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import optuna
from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.core.stage import StageConfig
from paretorch.pipeline.search.objectives import ATTR_REPEAT_OF
from paretorch.pipeline.search.record import FAIL, TrialRecord
from paretorch.pipeline.search.rule_out import is_ruled_out
from paretorch.pipeline.search.storage import retried

#: Consecutive repeats after which the budget stops the study: the sampler has run out of new recipes.
MAX_CONSECUTIVE_REPEATS = 25


def recipe_key(configs: Iterable[StageConfig | None], runtime: str) -> str:
    """One comparable string for a list of model-stage configs (None = off, left out) and a runtime."""
    stages = [c.to_dict() for c in configs if c is not None]
    return json.dumps({"runtime": runtime, "stages": stages}, sort_keys=True, default=str)


def is_repeat(trial: FrozenTrial) -> bool:
    """True for a trial that was answered by an earlier trial's measurement."""
    return trial.user_attrs.get(ATTR_REPEAT_OF) is not None


def not_counted(trial: FrozenTrial) -> bool:
    """True for a trial that was not run: a repeat, or a configuration ruled out before running
    (:mod:`paretorch.pipeline.search.rule_out`)."""
    return is_repeat(trial) or is_ruled_out(trial)


@dataclass
class RepeatIndex:
    """The recipes measured so far: requested and resolved keys -> the first trial that measured them."""

    first: dict[str, int] = field(default_factory=dict)

    def find(self, key: str) -> int | None:
        return self.first.get(key)

    def add(self, number: int, keys: Iterable[str | None]) -> None:
        for key in keys:
            if key is not None and key not in self.first:
                self.first[key] = number


class Repeats:
    """The recipes one study measured (complete, or infeasible for their recipe) under their requested and resolved
    keys: built from the study's storage on first use, then kept up to date as this process's trials end."""

    def __init__(self, export_nodes: Iterable[str]) -> None:
        self.export_nodes = tuple(export_nodes)
        self._index: RepeatIndex | None = None

    def original(self, study: optuna.Study, configs: Sequence[StageConfig | None], runtime: str) -> int | None:
        """The trial that measured these model stages under ``runtime`` first (None: none did)."""
        return self._built(study).find(recipe_key(configs, runtime))

    def measured(self, study: optuna.Study, configs: Sequence[StageConfig | None], runtime: str) -> bool:
        """Whether a trial measured (or was infeasible for) these model stages under ``runtime``."""
        return self.original(study, configs, runtime) is not None

    def add(self, record: TrialRecord) -> None:
        """Index a trial that ended (not a repeat, not a failure), once the index is built (else storage has it)."""
        if self._index is None or record.repeat_of is not None or record.state == FAIL:
            return
        resolved = recipe_key(record.recipe.model_stages(), record.runtime) if record.recipe else None
        requested = recipe_key(model_configs(record.configs, self.export_nodes), record.runtime)
        self._index.add(record.number, [requested, resolved])

    def _built(self, study: optuna.Study) -> RepeatIndex:
        if self._index is None:
            self._index = RepeatIndex()
            for done in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)),
                               key=lambda t: t.number):
                self.add(TrialRecord.from_trial(done))
        return self._index


def model_configs(configs: Mapping[str, StageConfig | None], export_nodes: Iterable[str]) -> list[StageConfig | None]:
    """The per-node configs without the export nodes (exports do not change what is measured)."""
    exports = set(export_nodes)
    return [config for name, config in configs.items() if name not in exports]


class TrialBudget:
    """The study's trial budget: ``total`` finished trials, not counting repeats and ruled-out configurations.
    Called after each trial, it marks the budget :attr:`exhausted` once the sampler proposes only those,
    :data:`MAX_CONSECUTIVE_REPEATS` in a row; the trial loop (:func:`paretorch.pipeline.search.workers.run_trials`)
    starts no trial once it is exhausted or :meth:`counted` reaches ``total``."""

    def __init__(self, total: int, states: tuple[TrialState, ...]) -> None:
        self.total = total
        self.states = states
        self.consecutive = 0
        self.exhausted = False

    def counted(self, study: optuna.Study) -> int:
        """Finished trials that count against the budget (not an interrupted or killed trial, whose config is
        enqueued again: :func:`~paretorch.pipeline.search.storage.retried`)."""
        trials = study.get_trials(deepcopy=False)
        again = retried(trials)
        return sum(1 for t in trials if t.state in self.states and not not_counted(t) and t.number not in again)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.consecutive = self.consecutive + 1 if not_counted(trial) else 0
        if self.consecutive >= MAX_CONSECUTIVE_REPEATS:
            self.exhausted = True
