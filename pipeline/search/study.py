"""One study of a search: its plan, its store and its model, and the study prepared for its trials.

:class:`Search` builds the study's plan (:class:`~.plan.StudyPlan`: what it searches), its store
(:class:`~.store.StudyStore`: where it is kept, and what it measured once) and its model (:class:`~.plan.StudyModel`:
the runner, the references, the rule-out facts, the paired latency), and prepares the study (:meth:`Search.prepare`:
open or resume it, its baseline and first seeds). The trial loop (:mod:`paretorch.pipeline.search.loop`) reads those
parts, never this object: a trial runs in :class:`~.trial_objective.TrialObjective` (its declared steps,
:mod:`~.trial_steps`), what the search proposes after each trial is :class:`~.proposals.Proposals` (all in
:mod:`paretorch.pipeline.search`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import optuna
import torch

from paretorch.pipeline.core.machine_probe import MachineProbe
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.search.config import SearchConfig, SeedRecipe, default_storage
from paretorch.pipeline.search.plan import StudyModel, StudyPlan
from paretorch.pipeline.search.seeding import Seeder
from paretorch.pipeline.search.store import Prepared, StudyStore


class Search:
    """One study: its :attr:`plan`, :attr:`store` and :attr:`model` (see the module docstring).

    Everything a run chooses is given here (nothing is set on a built search): ``worker``, this process's index among
    the study's workers (moves the sampler's seed); ``extra_seeds``, enqueued on every run after the config's seeds
    (``--enqueue RECIPE``; duplicates skipped); ``allow_nondeterministic``, go on when the unoptimized model's metric
    moves between passes; ``accept_plugin_change``, resume a study whose stages or runtimes changed."""

    def __init__(self, spec: ModelSpec, device: torch.device, config: SearchConfig, storage: str | None = None,
                 tracking_uri: str | None = None, track: bool = True, name: str | None = None, *,
                 worker: int = 0, extra_seeds: Sequence[SeedRecipe] = (),
                 allow_nondeterministic: bool = False, accept_plugin_change: bool = False) -> None:
        self.plan = StudyPlan.create(spec, device, config, worker=worker, extra_seeds=extra_seeds)
        self.store = StudyStore(self.plan, storage or default_storage(), name, tracking_uri=tracking_uri, track=track,
                                accept_plugin_change=accept_plugin_change,
                                allow_nondeterministic=allow_nondeterministic)
        self.model = StudyModel(self.plan, self.store)

    def prepare(self) -> tuple[optuna.Study, Prepared]:
        """Open (or create) the study for a run of its trials, with its baseline and seeds
        (:meth:`ensure_baseline`); the study and what to say about it first."""
        study, stages_line = self.store.open(create=True)
        return study, replace(self.ensure_baseline(study), stages_line=stages_line)

    def ensure_baseline(self, study: optuna.Study) -> Prepared:
        """The study's stored measurements, or measure them now (the self-check, the baseline, the noise floor, the
        machine probe: :class:`~.store.StudyStore`), and on a new study its first seeds (:meth:`Seeder.first`); the
        seeds this run adds. With the lines of the self-check, the noise floor and the presets enqueued (None where
        there were none)."""
        store, model = self.store, self.model
        presets_line: str | None = None
        with store.lock():  # workers starting together measure and enqueue once
            self_check_line = store.self_check(study, model)
            baseline = store.baseline(study, model)
            self.plan.objectives.threshold(baseline)  # a relative drop of a baseline <= 0 fails here, before any trial
            noise_line = store.noise_floor(study, model, baseline)
            machine = store.machine_probe(study)
            seeder = self.seeder(machine)
            if not study.trials:
                presets_line = seeder.first(study)
            for seed in self.plan.extra_seeds:
                seeder.enqueue(study, seed)
        return Prepared(baseline, machine, self_check_line=self_check_line, presets_line=presets_line,
                        noise_line=noise_line)

    def seeder(self, machine: MachineProbe | None = None) -> Seeder:
        """What enqueues this study's seeds, against the model's facts and what pays on this ``machine``."""
        return Seeder(self.plan, self.model.rules, machine)
