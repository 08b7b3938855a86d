"""What the search proposes after each trial, besides its sampler: compositions, then the runtime sweep.

:class:`Proposals` is a study callback ``(study, trial, record)`` (the trial loop hands it the record the
trial objective returned). Once no enqueued trial waits, it enqueues, in this order, the first of these that
has anything: the compositions of the measured winners (:mod:`paretorch.pipeline.search.compose`); the ``sweep_top``
fastest feasible stage lists (resolved: a calibrated AMP policy replays, with no calibration) under each
runtime not yet tried with them (:mod:`paretorch.pipeline.search.sweep`; a runtime that cannot run a stage list,
:meth:`SeedQueue.runs`, takes the next fastest it can), the unoptimized model's own list left out; the seeds the study
held back (:func:`Proposals.release_later`); then the sweep of the unoptimized model's list. The held-back seeds come
before that list's sweep: they hold its float32 runtimes (the ``fp32@runtime`` presets) and the reduced precisions the
machine probe could not decide, which can pay far more (all-mpnet-base-v2 on a Zen 4 EPYC, 10 trials: the baseline's
sweep spent five of them on fp32 runtimes, 0.94x-2.42x, while ``bf16@openvino``, OpenVINO's own default there at 4.86x,
waited behind it).
Compositions come before the sweep: where int8 pays, ``prune depth + int8s | ov`` is worth more than
``prune depth`` under four more runtimes (the MiniLM CPU search reached the peer's level at trial 18, 955 s,
while the sweep of the first seeds ran first). Feasible means :meth:`Objectives.verdict
<paretorch.pipeline.search.objectives.Objectives.verdict>` says so: the one verdict behind the trial's tag, its
Optuna constraint and these proposals.

It receives what it uses, as values and typed ports: the study's plan, its baseline, the queue it enqueues through
(:class:`SeedQueue`: :class:`paretorch.pipeline.search.seeding.Seeder`) and what the study measured already
(:class:`Measured`: :class:`paretorch.pipeline.search.duplicates.Repeats`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.core.stage import StageConfig, config_from_dict
from paretorch.pipeline.search.compose import Composition, composed_count, compositions, measured
from paretorch.pipeline.search.config import SeedRecipe
from paretorch.pipeline.search.dead_ends import RuntimeGains
from paretorch.pipeline.search.objectives import Baseline
from paretorch.pipeline.search.plan import StudyPlan
from paretorch.pipeline.search.presets import ATTR_LATER_SEEDS, is_preset
from paretorch.pipeline.search.record import COMPLETE, TrialRecord
from paretorch.pipeline.search.sweep import RuntimeSweepIndex, SweepProposal, SweptStages


class SeedQueue(Protocol):
    """Where the proposals go (:class:`paretorch.pipeline.search.seeding.Seeder`)."""

    def enqueue(self, study: optuna.Study, seed: SeedRecipe) -> bool:
        """Enqueue ``seed`` on the study; False if skipped (a repeat, or not a trial here)."""
        ...

    def runs(self, configs: Sequence[StageConfig], runtime: str) -> bool:
        """Whether these model stages can be a trial under ``runtime`` here."""
        ...


class Measured(Protocol):
    """What the study measured already (:class:`paretorch.pipeline.search.duplicates.Repeats`)."""

    def measured(self, study: optuna.Study, configs: Sequence[StageConfig | None], runtime: str) -> bool:
        """Whether a trial measured (or was infeasible for) these model stages under ``runtime``."""
        ...


class Proposals:
    """The runtime sweep and the compositions of one study (see the module docstring)."""

    def __init__(self, plan: StudyPlan, baseline: Baseline, queue: SeedQueue, known: Measured) -> None:
        self.config = plan.config
        self.objectives = plan.objectives
        self.baseline = baseline
        self.runtimes = list(plan.runtimes)
        self.nodes = plan.stage_names()
        self.export_nodes = set(plan.export_names())
        self.queue = queue
        self.known = known
        self._sweep: RuntimeSweepIndex | None = None
        self._gains: RuntimeGains | None = None

    def __call__(self, study: optuna.Study, trial: FrozenTrial, record: TrialRecord) -> None:
        latency = self.feasible_latency(record)
        self.sweep_index(study).add(record, latency, is_preset(record.seed))
        self.gains(study).add(record, latency is not None)
        if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return
        if not (self.compose(study) or self.sweep(study, unoptimized=False) or self.release_later(study)):
            self.sweep(study)

    def sweep(self, study: optuna.Study, unoptimized: bool = True) -> int:
        """Enqueue the runtime sweep's proposals (``unoptimized``: the unoptimized model's stage list's too); how many
        were enqueued."""
        proposals = [p for p in self.sweep_index(study).proposals(self.runtimes, self.config.sweep_top, self.runnable,
                                                                  self.sweep_worth) if unoptimized or p.stages]
        return sum(self.queue.enqueue(study, SeedRecipe(name=f"runtime-sweep-of-trial-{proposal.number}",
                                                        runtime=proposal.runtime, stages=proposal.stages,
                                                        estimate=self.sweep_estimate(proposal)))
                   for proposal in proposals)

    def release_later(self, study: optuna.Study) -> int:
        """Enqueue the seeds the study held back for the first compositions and the sweep (the presets that do not
        pay first, the costly seeds: :func:`paretorch.pipeline.search.presets.initial_queue`); how many were enqueued (a
        seed already tried is skipped)."""
        later = study.user_attrs.get(ATTR_LATER_SEEDS) or []
        if not later:
            return 0
        return sum(self.queue.enqueue(study, SeedRecipe(**raw)) for raw in later)

    def runnable(self, stages: tuple[dict[str, object], ...], runtime: str) -> bool:
        """Whether ``runtime`` can run these resolved stages (as the sweep keeps them)."""
        return self.queue.runs([config_from_dict(dict(s)) for s in stages], runtime)

    def compose(self, study: optuna.Study) -> int:
        """Enqueue compositions of the measured winners up to the config's ``compose`` cap; how many were
        enqueued."""
        trials = study.get_trials(deepcopy=False)
        room = self.config.compose - composed_count(trials)
        if room <= 0:
            return 0
        records = [TrialRecord.from_trial(t) for t in trials if t.state == TrialState.COMPLETE]
        winners = [m for r in records
                   if (m := measured(r, self.feasible_latency(r) is not None, self.export_nodes))]
        options = compositions(winners, self.runtimes, self.nodes, self.objectives.threshold(self.baseline),
                               limit=room, known=lambda configs, runtime: (self.known.measured(study, configs, runtime)
                                                                           or not self.queue.runs(configs, runtime)),
                               worth=self.composition_worth)
        return sum(self.queue.enqueue(study, SeedRecipe(name=c.name, runtime=c.runtime,
                                                        stages=tuple(x.to_dict() for x in c.configs),
                                                        estimate={"gain": c.estimated_gain})) for c in options)

    def gains(self, study: optuna.Study) -> RuntimeGains:
        """What the measured trials say about each runtime (:mod:`paretorch.pipeline.search.dead_ends`), built from the
        study's trials with a paired speed-up on first use, then kept up to date."""
        if self._gains is None:
            self._gains = RuntimeGains.of(study, lambda record: self.feasible_latency(record) is not None)
        return self._gains

    def sweep_worth(self, best: SweptStages, runtime: str) -> bool:
        """Whether the sweep may propose ``best``'s stage list under ``runtime``: not a measured dead end."""
        if self._gains is None or best.latency <= 0:
            return True
        speedup = self.baseline.latency_ms / best.latency
        return not self._gains.dead_end(self._gains.estimate(speedup, best.runtime, runtime))

    def sweep_estimate(self, proposal: SweepProposal) -> dict[str, object] | None:
        """What a sweep proposal's estimate starts from: its source trial's speed-up and runtime."""
        if proposal.latency <= 0:
            return None
        return {"speedup": self.baseline.latency_ms / proposal.latency, "under": proposal.measured_under}

    def composition_worth(self, option: Composition) -> bool:
        """Whether a composition can still win under its runtime: not a measured dead end."""
        if self._gains is None:
            return True
        return not self._gains.dead_end(self._gains.plain_estimate(option.estimated_gain, option.runtime))

    def sweep_index(self, study: optuna.Study) -> RuntimeSweepIndex:
        """The sweep's index, built from the study's complete trials on first use, then kept up to date."""
        if self._sweep is None:
            self._sweep = RuntimeSweepIndex()
            for done in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                record = TrialRecord.from_trial(done)
                self._sweep.add(record, self.feasible_latency(record), is_preset(record.seed))
        return self._sweep

    def feasible_latency(self, record: TrialRecord) -> float | None:
        """The trial's objective latency if it completed and its verdict is feasible, else None."""
        value = record.metrics.get(self.objectives.spec.metric.name)
        latency = self.objectives.objective_latency(record.metrics)[0]
        if record.state != COMPLETE or value is None or math.isnan(latency):
            return None
        verdict = self.objectives.verdict(self.baseline, value, record.latency_unstable, record.metrics)
        return float(latency) if verdict.feasible and verdict.unstable is None else None
