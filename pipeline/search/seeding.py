"""Optuna params for enqueued trials (the baseline, the seeds, the runtime sweep).

A seed is a list of stage configs; the sampler's plots (importance, slice, contour) see
only Optuna params. :func:`seed_params` finds the params under which each stage's own
``suggest`` returns the seed's config, by answering its ``suggest_*`` calls from the
config (param ``<stage>.<field>`` -> the config's field; ``<stage>.enabled`` -> whether the
stage is on; a choice ``"none"`` -> off) and keeping them only when ``suggest`` then
returns exactly the seed's config and every value lies in its distribution. A seed stage
whose config ``suggest`` cannot produce (e.g. a field the search space does not vary,
set away from its default) gets no params; the trial still runs the seed's config.

:class:`Seeder` enqueues a study's seeds with those params: a new study's baseline, precision presets and the config's
seeds (:meth:`Seeder.first`), the seeds a run adds, and what the search proposes after each trial
(:class:`paretorch.pipeline.search.proposals.Proposals` enqueues through it); a seed that cannot be a trial here is
skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeGuard, cast

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalChoiceType,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from paretorch.pipeline.core.device import capabilities
from paretorch.pipeline.core.machine_probe import MachineProbe, probe_reason
from paretorch.pipeline.core.stage import StageConfig, StageContext, config_from_dict, stage_for
from paretorch.pipeline.search.config import SeedRecipe
from paretorch.pipeline.search.objectives import ATTR_SEED, ATTR_SEED_PARAMS, ATTR_SEED_RECIPE, BASELINE_SEED
from paretorch.pipeline.search.plan import StudyPlan
from paretorch.pipeline.search.presets import (
    ATTR_LATER_SEEDS,
    ATTR_SKIPPED_PRESETS,
    initial_queue,
    is_preset,
    preset_seeds,
    repeats,
)
from paretorch.pipeline.search.rule_out import RuleOut

OFF_CHOICE = "none"


#: How many choice combinations of derived categorical params one stage may try.
MAX_PROBES = 64


class _Unanswerable(Exception):
    """The probe cannot answer a param from the config."""


class _Branch(Exception):
    """A categorical param that is no config field (e.g. ``prune.structure``): try each choice."""

    def __init__(self, name: str, choices: Sequence[CategoricalChoiceType]) -> None:
        super().__init__(name)
        self.name = name
        self.choices = list(choices)


class _Probe:
    """Stands in for an ``optuna.Trial`` inside ``suggest``: answers each param from a config,
    and derived categorical params from ``chosen`` (a branch of the search in :func:`stage_params`)."""

    def __init__(self, stage: str, config: StageConfig | None, chosen: Mapping[str, CategoricalChoiceType]) -> None:
        self.stage = stage
        self.values: dict[str, object] | None = config.model_dump(mode="json") if config is not None else None
        self.chosen = chosen
        self.params: dict[str, CategoricalChoiceType] = {}

    def _answer(self, name: str, distribution: BaseDistribution) -> CategoricalChoiceType:
        field = name.removeprefix(f"{self.stage}.")
        if name in self.chosen:
            value: object = self.chosen[name]
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
        if _contains(value, distribution):
            self.params[name] = value
            return value
        raise _Unanswerable(name)

    def suggest_categorical(self, name: str, choices: Sequence[CategoricalChoiceType]) -> CategoricalChoiceType:
        return self._answer(name, CategoricalDistribution(list(choices)))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        return float(self._number(name, FloatDistribution(low, high, step=step, log=log)))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return int(self._number(name, IntDistribution(low, high, step=step, log=log)))

    def _number(self, name: str, distribution: FloatDistribution | IntDistribution) -> int | float:
        """The answer of a numeric param (:func:`_contains` admits numbers alone into a numeric distribution)."""
        value = self._answer(name, distribution)
        if not isinstance(value, int | float):
            raise _Unanswerable(name)
        return value


def _contains(value: object, distribution: BaseDistribution) -> TypeGuard[CategoricalChoiceType]:
    """``value`` is an answer that lies in ``distribution``."""
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
                 ctx: StageContext) -> dict[str, CategoricalChoiceType] | None:
    """The params under which ``config_type.suggest`` returns ``config`` (None: it cannot).

    Params that are config fields are read from the config; a categorical param that is not
    (one that picks which fields to set) is tried choice by choice, depth first."""
    pending: list[dict[str, CategoricalChoiceType]] = [{}]
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


def merge_params(parts: Mapping[str, Mapping[str, CategoricalChoiceType] | None]) -> dict[str, CategoricalChoiceType]:
    """One params dict from per-stage params (stages without params left out)."""
    merged: dict[str, CategoricalChoiceType] = {}
    for params in parts.values():
        merged.update(params or {})
    return merged


class Seeder:
    """Enqueues seeds on the study of ``plan``, read against the model's facts (``rules``) and what pays on this
    machine (``machine``; None: not probed yet, nothing skipped for it)."""

    def __init__(self, plan: StudyPlan, rules: RuleOut, machine: MachineProbe | None = None) -> None:
        self.plan = plan
        self.rules = rules
        self.machine = machine

    def first(self, study: optuna.Study) -> str | None:
        """A new study's queue: the baseline, the precision presets under every runtime
        (:mod:`paretorch.pipeline.search.presets`: cheap trials first) and the config's seeds, those that wait
        stored on the study (:data:`~paretorch.pipeline.search.presets.ATTR_LATER_SEEDS`); the presets' line."""
        self.enqueue(study, SeedRecipe(name=BASELINE_SEED))
        presets = preset_seeds(self.plan.config.presets, self.plan.runtimes, self.preset_skip, self.machine)
        study.set_user_attr(ATTR_SKIPPED_PRESETS, presets.skipped)
        now, later = initial_queue(presets, self.plan.config.seeds)
        enqueued = [seed for seed in now if self.enqueue(study, seed)]
        later = [seed for seed in later if not repeats(study, seed)]
        study.set_user_attr(ATTR_LATER_SEEDS, [seed.model_dump(mode="json") for seed in later])
        return presets.describe([s for s in enqueued if is_preset(s.name)], [s for s in later if is_preset(s.name)])

    def enqueue(self, study: optuna.Study, seed: SeedRecipe) -> bool:
        """Enqueue ``seed`` unless a trial already carries the same seed; False if skipped (its stages are not in the
        pipeline or are disabled, or a stage says it is not worth a trial on this device:
        :meth:`paretorch.pipeline.core.stage.Stage.not_worthwhile`, or the seed is
        :attr:`~paretorch.pipeline.search.config.SeedRecipe.skip_where_unavailable` and this device cannot run it or the
        model's facts rule it out). Any other seed that cannot change this model is enqueued: it is answered before it
        runs, with its reason, and not counted (:mod:`paretorch.pipeline.search.rule_out`), so the user sees why."""
        if any(raw.get("stage") not in self.plan.searched_stages() for raw in seed.stages):
            return False
        configs = [config_from_dict(dict(raw)) for raw in seed.stages]  # validates the seed's fields
        caps = capabilities(self.plan.device)
        if any(stage_for(c).not_worthwhile(c, caps) for c in configs):
            return False  # the capability table says it can only be slower here
        unavailable = seed.skip_where_unavailable and (any(stage_for(c).unavailable(c, caps) for c in configs)
                                                       or self.rules.reason(configs) is not None)
        if unavailable or repeats(study, seed):
            return False
        params = self.seed_params(configs, seed.runtime)
        study.enqueue_trial(params, user_attrs={ATTR_SEED: seed.name, ATTR_SEED_RECIPE: seed.payload(),
                                                ATTR_SEED_PARAMS: params, **seed.trial_attrs()})
        return True

    def runs(self, configs: Sequence[StageConfig], runtime: str) -> bool:
        """Whether these model stages can be a trial under ``runtime`` here: not ruled out by the model's facts, run
        by the runtime, and not a precision the machine probe says does not pay under it."""
        return (self.rules.reason(configs) or self.rules.runtime_reason(configs, runtime)
                or self.probe_reason(tuple(c.to_dict() for c in configs), runtime)) is None

    def probe_reason(self, stages: tuple[Mapping[str, object], ...], runtime: str) -> str | None:
        """Why the machine probe says a stage list does not pay under ``runtime`` here (None: it may)."""
        return probe_reason(self.machine, stages, runtime) if self.machine is not None else None

    def preset_skip(self, stages: tuple[dict[str, object], ...], runtime: str) -> str | None:
        """Why a preset's ``stages`` cannot be a trial under ``runtime`` here (None: they can): a stage not in
        the pipeline (or disabled), or the chain ruled out before it would run (slower only on this device,
        unable to change this model, not runnable on the device, or not by the runtime)."""
        missing = sorted({str(raw.get("stage")) for raw in stages} - self.plan.searched_stages())
        if missing:
            return f"not in this pipeline: {', '.join(missing)}"
        configs = [config_from_dict(dict(raw)) for raw in stages]
        return (self.probe_reason(stages, runtime) or self.rules.reason(configs) or self.rules.unavailable(configs)
                or self.rules.runtime_reason(configs, runtime))

    def seed_params(self, configs: list[StageConfig], runtime: str) -> dict[str, object]:
        """The Optuna params of a seed (so seeded trials appear in the sampler's plots), by stage node."""
        plan = self.plan
        ctx = StageContext(spec=plan.spec, device=plan.device, facts=self.rules.facts)
        remaining = list(configs)
        parts: dict[str, dict[str, CategoricalChoiceType] | None] = {}
        upstream: list[StageConfig] = []
        for node in plan.pipeline.stage_nodes():
            exporting = plan.pipeline.kind(node.name) == "export"
            if node.config is not None or node.name in plan.config.disabled or exporting:
                continue
            config = next((c for c in remaining if c.stage == node.op), None)
            if config is not None:
                remaining.remove(config)
            ctx.upstream = tuple(upstream)
            parts[node.name] = stage_params(plan.pipeline.stage(node.name).config_type, node.op, config, ctx)
            if config is not None:
                upstream.append(config)
        return {**merge_params(parts), **runtime_params(runtime, plan.runtimes)}
