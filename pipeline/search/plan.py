"""What one study searches, the model it searches on, and the parts its trials share.

* :class:`StudyPlan`: the model spec on its device, the search settings, the pipeline, the objectives, the runtimes the
  device offers, this process's worker index and the seeds this run adds; values, fixed when the search is built;
* :class:`StudyModel`: the unoptimized model, built on first use by the study's runner (which runs every trial through
  its cache), what is read from it once (its reference outputs, its input reference, its rule-out facts), and the paired
  latency against it;
* :class:`StudyParts`: the plan with what is built from it, one frozen record of what a trial, its line and MLflow
  run, the front's re-measure and its exports use (:meth:`StudyModel.parts`), never the
  :class:`~paretorch.pipeline.search.study.Search` that opened the study.

The study's store (its storage, lock, name and stored measurements) is :mod:`paretorch.pipeline.search.store`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Protocol

import torch
from torch import Tensor

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.input_agreement import Reference
from paretorch.pipeline.core.latency import LATENCY_BUDGETS
from paretorch.pipeline.core.paths import cache_dir, results_dir
from paretorch.pipeline.core.runtimes.registry import available_runtimes
from paretorch.pipeline.core.self_check import lazy_reference
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.workload import workload_for
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.graph import Pipeline, load_pipeline
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.search.config import ALL_RUNTIMES, SearchConfig, SeedRecipe
from paretorch.pipeline.search.objectives import Objectives
from paretorch.pipeline.search.rule_out import RuleOut
from paretorch.pipeline.search.study_latency import StudyLatency


@dataclass(frozen=True)
class StudyPlan:
    """What one study searches (see the module docstring). ``worker``: this process's index among the study's workers
    (moves the sampler's seed); ``extra_seeds``: enqueued on every run after the config's seeds (``--enqueue
    RECIPE``; duplicates skipped)."""

    spec: ModelSpec
    device: torch.device
    config: SearchConfig
    pipeline: Pipeline
    objectives: Objectives
    #: The config's runtimes that run on this device, in its order.
    runtimes: tuple[str, ...]
    worker: int = 0
    extra_seeds: tuple[SeedRecipe, ...] = ()

    @classmethod
    def create(cls, spec: ModelSpec, device: torch.device, config: SearchConfig, *, worker: int = 0,
               extra_seeds: Sequence[SeedRecipe] = ()) -> StudyPlan:
        """The plan of ``config`` for ``spec`` on ``device``: a :class:`ConfigError` for a disabled node the pipeline
        lacks, or where none of the config's runtimes runs on the device."""
        pipeline = load_pipeline(config.pipeline)
        stage_names = {n.name for n in pipeline.stage_nodes()}
        unknown = sorted(set(config.disabled) - stage_names)
        if unknown:
            raise ConfigError(f"cannot disable {unknown}: the pipeline's stage nodes are {sorted(stage_names)}")
        objectives = Objectives.create(spec, config.objectives, config.max_drop, config.latency_batch,
                                       config.tail_guard())
        possible = available_runtimes(device)
        runtimes = possible if config.runtimes == ALL_RUNTIMES else [r for r in config.runtimes if r in possible]
        if not runtimes:
            raise ConfigError(f"none of the runtimes {list(config.runtimes)} runs on {device.type} "
                              f"(available: {', '.join(possible)})")
        return cls(spec, device, config, pipeline, objectives, tuple(runtimes), worker, tuple(extra_seeds))

    def stage_names(self) -> list[str]:
        """The pipeline's stage nodes (model stages and exports), in order."""
        return [n.name for n in self.pipeline.stage_nodes()]

    def export_names(self) -> list[str]:
        """The pipeline's export nodes, in order."""
        return [n.name for n in self.pipeline.export_nodes()]

    def searched_stages(self) -> set[str]:
        """The stages (ops) a trial may run: the pipeline's stage nodes not disabled."""
        return {n.op for n in self.pipeline.stage_nodes() if n.name not in self.config.disabled}

    def latency_batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes a trial is timed at: the objective's alone, whatever the budget (another batch size
        would cost a compiled runtime two more compilations a trial and decides nothing; ``evaluate`` and
        ``apply`` time every spec batch size). ``--latency-batch 256`` need not be a spec batch size."""
        return (self.objectives.latency_batch,)


class Named(Protocol):
    """What the model reads of the study's store (:class:`paretorch.pipeline.search.store.StudyStore`): the study's
    name, which names the runner's work folder."""

    @property
    def study_name(self) -> str: ...


class StudyModel:
    """The unoptimized model of one study and what is read from it once (see the module docstring). The paired latency
    is built at once (its timer and CPU clock are injectable before anything runs); the runner, and with it the model,
    on first use."""

    def __init__(self, plan: StudyPlan, store: Named) -> None:
        self.plan = plan
        self._store = store
        #: Paired latency of the trials against the baseline (its timer and CPU clock are injectable).
        self.latency = StudyLatency(plan.spec, plan.device, plan.objectives.latency_batch, lambda: self.runner,
                                    LATENCY_BUDGETS[plan.config.latency_budget],
                                    workload_for(plan.config.workload, plan.spec, plan.objectives.latency_batch))

    @cached_property
    def runner(self) -> Runner:
        """The study's runner: it builds and checks the model once and runs every trial through its cache."""
        plan = self.plan
        return Runner(
            plan.pipeline, plan.spec, plan.device,
            cache=NodeCache(plan.config.cache_mb * 1024**2, export_dir=cache_dir("exports")),
            latency=self.latency.settings,  # the settings the paired rounds use: one budget
            batch_sizes=plan.latency_batch_sizes(),
            work_dir=results_dir() / "work" / self._store.study_name,
            reference=lambda: self.input_reference,
        )

    @cached_property
    def reference(self) -> Callable[[], tuple[Tensor, Tensor]]:
        """The unoptimized model's outputs and the targets over the evaluation, computed on first use and kept: the
        self-check, the baseline and every trial's per-input view read this one pass."""
        return lazy_reference(self.runner.model, self.plan.spec, self.plan.device)

    @cached_property
    def input_reference(self) -> Reference:
        """What every trial is compared with input by input (:mod:`paretorch.pipeline.core.input_agreement`)."""
        return Reference.of(self.reference()[0], self.plan.spec.output_kind, self.plan.config.tail_cosine)

    @cached_property
    def rules(self) -> RuleOut:
        """What the unoptimized model's facts rule out (:mod:`paretorch.pipeline.search.rule_out`), read once."""
        pipeline = self.plan.pipeline
        stages = [pipeline.stage(n.name) for n in pipeline.stage_nodes()]
        return RuleOut.read(self.runner.model, self.plan.spec, self.plan.device, stages)

    def parts(self) -> StudyParts:
        """What the study's trials, their log and the front's exports use (the runner and the rule-out facts
        are built on first use: the model loads once)."""
        planned = {field.name: getattr(self.plan, field.name) for field in fields(StudyPlan)}
        return StudyParts(**planned, study_name=self._store.study_name, runner=self.runner, latency=self.latency,
                          rules=self.rules)


@dataclass(frozen=True, kw_only=True)
class StudyParts(StudyPlan):
    """A study's plan with what its trials share: the study's name, its runner, the paired latency and the rule-out
    facts."""

    study_name: str
    runner: Runner
    latency: StudyLatency
    rules: RuleOut
