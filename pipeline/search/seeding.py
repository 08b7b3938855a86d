"""Optuna params for enqueued trials (the baseline, the seeds, the runtime sweep).

A seed is a list of stage configs; the sampler's plots (importance, slice, contour) see
only Optuna params. :func:`seed_params` finds the params under which each stage's own
``suggest`` returns the seed's config, by answering its ``suggest_*`` calls from the
config (param ``<stage>.<field>`` -> the config's field; ``<stage>.enabled`` -> whether the
stage is on; a choice ``"none"`` -> off) and keeping them only when ``suggest`` then
returns exactly the seed's config and every value lies in its distribution. A seed stage
whose config ``suggest`` cannot produce (e.g. a field the search space does not vary,
set away from its default) gets no params; the trial still runs the seed's config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from paretorch.pipeline.core.stage import StageConfig, StageContext

OFF_CHOICE = "none"


#: How many choice combinations of derived categorical params one stage may try.
MAX_PROBES = 64


class _Unanswerable(Exception):
    """The probe cannot answer a param from the config."""


class _Branch(Exception):
    """A categorical param that is no config field (e.g. ``prune.structure``): try each choice."""

    def __init__(self, name: str, choices: Sequence[Any]) -> None:
        super().__init__(name)
        self.name = name
        self.choices = list(choices)


class _Probe:
    """Stands in for an ``optuna.Trial`` inside ``suggest``: answers each param from a config,
    and derived categorical params from ``chosen`` (a branch of the search in :func:`stage_params`)."""

    def __init__(self, stage: str, config: StageConfig | None, chosen: Mapping[str, Any]) -> None:
        self.stage = stage
        self.values = config.model_dump(mode="json") if config is not None else None
        self.chosen = chosen
        self.params: dict[str, Any] = {}

    def _answer(self, name: str, distribution: BaseDistribution) -> Any:
        field = name.removeprefix(f"{self.stage}.")
        if name in self.chosen:
            value: Any = self.chosen[name]
        elif field == "enabled":
            value = self.values is not None
        elif self.values is None:
            if not (isinstance(distribution, CategoricalDistribution) and OFF_CHOICE in distribution.choices):
                raise _Unanswerable(name)
            value = OFF_CHOICE
        elif field in self.values:
            value = self.values[field]
        elif isinstance(distribution, CategoricalDistribution):
            raise _Branch(name, distribution.choices)
        else:
            raise _Unanswerable(name)
        if not _contains(distribution, value):
            raise _Unanswerable(name)
        self.params[name] = value
        return value

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._answer(name, CategoricalDistribution(list(choices)))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        return float(self._answer(name, FloatDistribution(low, high, step=step, log=log)))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return int(self._answer(name, IntDistribution(low, high, step=step, log=log)))


def _contains(distribution: BaseDistribution, value: Any) -> bool:
    if isinstance(distribution, CategoricalDistribution):
        return value in distribution.choices
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(distribution, FloatDistribution | IntDistribution):
        if not distribution.low <= value <= distribution.high:
            return False
        step = distribution.step
        return step is None or abs((value - distribution.low) / step - round((value - distribution.low) / step)) < 1e-6
    return False


def stage_params(config_type: type[StageConfig], stage: str, config: StageConfig | None,
                 ctx: StageContext) -> dict[str, Any] | None:
    """The params under which ``config_type.suggest`` returns ``config`` (None: it cannot).

    Params that are config fields are read from the config; a categorical param that is not
    (one that picks which fields to set) is tried choice by choice, depth first."""
    pending: list[dict[str, Any]] = [{}]
    for _ in range(MAX_PROBES):
        if not pending:
            break
        probe = _Probe(stage, config, pending.pop())
        try:
            produced = config_type.suggest(cast(optuna.Trial, probe), ctx)
        except _Branch as branch:
            pending.extend({**probe.chosen, branch.name: choice} for choice in reversed(branch.choices))
            continue
        except (_Unanswerable, ValueError):
            continue
        same = (produced is None and config is None) or (
            produced is not None and config is not None and produced.to_dict() == config.to_dict())
        if same:
            return probe.params
    return None


def runtime_params(runtime: str, runtimes: Sequence[str]) -> dict[str, str]:
    """The ``runtime`` param, where the search suggests one (more than one runtime) and it is among them."""
    return {"runtime": runtime} if len(runtimes) > 1 and runtime in runtimes else {}


def merge_params(parts: Mapping[str, dict[str, Any] | None]) -> dict[str, Any]:
    """One params dict from per-stage params (stages without params left out)."""
    merged: dict[str, Any] = {}
    for params in parts.values():
        merged.update(params or {})
    return merged
