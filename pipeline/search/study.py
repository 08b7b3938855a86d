"""One study's lifecycle: its storage and lock, open or resume, the runner, the baseline and the seeds.

A trial runs in :class:`~.trial_objective.TrialObjective` (choose -> rule out -> run -> record); what the search
proposes after each trial (the runtime sweep, compositions) is :class:`~.proposals.Proposals`; the trial loop is
:func:`~.workers.run_trials` (all three in :mod:`paretorch.pipeline.search`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property

import optuna
import torch
from torch import Tensor

from paretorch.pipeline.core.device import capabilities
from paretorch.pipeline.core.errors import ConfigError, PipelineError
from paretorch.pipeline.core.evaluate import Known
from paretorch.pipeline.core.input_agreement import Reference
from paretorch.pipeline.core.latency import LATENCY_BUDGETS
from paretorch.pipeline.core.machine_probe import MachineProbe, probe_machine, probe_reason
from paretorch.pipeline.core.noise_floor import NoiseFloor, noise_floor
from paretorch.pipeline.core.paths import cache_dir, results_dir
from paretorch.pipeline.core.runtimes.registry import available_runtimes, declared_probes
from paretorch.pipeline.core.secrets import mask_secrets
from paretorch.pipeline.core.self_check import SelfCheck, lazy_reference, require_stable, self_check
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import StageConfig, StageContext, config_from_dict, registered_stages, stage_for
from paretorch.pipeline.core.workload import workload_for
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.graph import load_pipeline
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.search.config import (
    ALL_RUNTIMES,
    SearchConfig,
    SeedRecipe,
    default_storage,
    finished_states,
    legacy_study_names,
    make_sampler,
    study_name,
)
from paretorch.pipeline.search.objectives import (
    ATTR_BASELINE,
    ATTR_CONFIGS,
    ATTR_SEARCH,
    ATTR_SEED,
    ATTR_SEED_PARAMS,
    ATTR_SEED_RECIPE,
    Baseline,
    Objectives,
)
from paretorch.pipeline.search.prepared import Prepared
from paretorch.pipeline.search.presets import (
    ATTR_LATER_SEEDS,
    ATTR_SKIPPED_PRESETS,
    initial_queue,
    is_preset,
    preset_seeds,
    repeats,
)
from paretorch.pipeline.search.rule_out import RuleOut
from paretorch.pipeline.search.seeding import merge_params, runtime_params, stage_params
from paretorch.pipeline.search.storage import StudyLock, fail_dead_trials, open_storage
from paretorch.pipeline.search.study_latency import StudyLatency
from paretorch.pipeline.search.study_names import (
    ATTR_RUNTIMES,
    ATTR_STAGES,
    ATTR_STUDY_KEY,
    find_study,
    require_accepted,
    runtime_change,
    stage_change,
)
from paretorch.pipeline.search.study_parts import StudyParts

#: Study user attr: the unoptimized model's self-check (paretorch.pipeline.core.self_check), measured once per study.
ATTR_SELF_CHECK = "self_check"
#: Study user attr: the metric's noise floor (:class:`paretorch.pipeline.core.noise_floor.NoiseFloor`), measured once.
ATTR_NOISE_FLOOR = "paretorch.noise_floor"
#: Study user attr: what pays on this machine (paretorch.pipeline.core.machine_probe), measured once per study.
ATTR_MACHINE_PROBE = "machine_probe"


class Search:
    """One study's lifecycle: storage, lock, open or resume, runner, baseline and seeds.

    Everything a run chooses is given here (nothing is set on a built search): ``worker``, this
    process's index among the study's workers (moves the sampler's seed); ``extra_seeds``, enqueued on
    every run after the config's seeds (``--enqueue RECIPE``; duplicates skipped);
    ``allow_nondeterministic``, go on when the unoptimized model's metric moves between passes."""

    def __init__(self, spec: ModelSpec, device: torch.device, config: SearchConfig, storage: str | None = None,
                 tracking_uri: str | None = None, track: bool = True, name: str | None = None, *,
                 worker: int = 0, extra_seeds: Sequence[SeedRecipe] = (),
                 allow_nondeterministic: bool = False, accept_plugin_change: bool = False) -> None:
        self.spec = spec
        self.device = device
        self.config = config
        self.pipeline = load_pipeline(config.pipeline)
        stage_names = {n.name for n in self.pipeline.stage_nodes()}
        unknown = sorted(set(config.disabled) - stage_names)
        if unknown:
            raise ConfigError(f"cannot disable {unknown}: the pipeline's stage nodes are {sorted(stage_names)}")
        self.objectives = Objectives.create(spec, config.objectives, config.max_drop, config.latency_batch,
                                            config.tail_guard())
        possible = available_runtimes(device)
        self.runtimes = possible if config.runtimes == ALL_RUNTIMES else [r for r in config.runtimes if r in possible]
        if not self.runtimes:
            raise ConfigError(f"none of the runtimes {list(config.runtimes)} runs on {device.type} "
                              f"(available: {', '.join(possible)})")
        self._given_name = name
        self._name: str | None = name
        self.storage = storage or default_storage()
        self.tracking_uri = tracking_uri
        self.track = track
        self.worker = worker
        self.extra_seeds = tuple(extra_seeds)
        #: What pays on this machine, read or measured when the study is prepared (:meth:`probe_machine`).
        self.machine: MachineProbe | None = None
        self.allow_nondeterministic = allow_nondeterministic
        self.accept_plugin_change = accept_plugin_change
        self._runner: Runner | None = None
        self._storage: optuna.storages.BaseStorage | None = None
        #: Paired latency of the trials against the baseline (its timer and CPU clock are injectable).
        self.latency = StudyLatency(spec, device, self.objectives.latency_batch, lambda: self.runner,
                                    LATENCY_BUDGETS[config.latency_budget],
                                    workload_for(config.workload, spec, self.objectives.latency_batch))

    @property
    def study_name(self) -> str:
        """``--study-name``, else the stored study that answers to the default name (a study named before
        names stopped hashing the stage list keeps its name: :mod:`paretorch.pipeline.search.study_names`), else the
        default name. Looked up in the storage once."""
        if self._name is None:
            key = study_name(self.spec, self.device, self.config, self.pipeline)
            legacy = legacy_study_names(self.spec, self.device, self.config, self.pipeline)
            stored = {s.study_name: s.user_attrs for s in self.storage_backend().get_all_studies()}
            self._name = find_study(stored, key, legacy)
        return self._name

    # ------------------------------------------------------------------ study

    @property
    def storage_label(self) -> str:
        """The storage URL with any password masked: the form to print, log or tag."""
        return mask_secrets(self.storage)

    def storage_backend(self) -> optuna.storages.BaseStorage:
        """The Optuna storage, opened once (each open of a URL re-checks the schema: seconds)."""
        if self._storage is None:
            self._storage = open_storage(self.storage)
        return self._storage

    def lock(self) -> StudyLock:
        """The study's lock, shared by all workers (see :mod:`paretorch.pipeline.search.storage`)."""
        return StudyLock(self.storage, self.storage_backend(), self.study_name)

    def study_names(self) -> list[str]:
        return [s.study_name for s in self.storage_backend().get_all_studies()]

    def prepare(self) -> tuple[optuna.Study, Prepared]:
        """Open (or create) the study for a run of its trials, with its baseline and seeds
        (:meth:`ensure_baseline`); the study and what to say about it first."""
        study, stages_line = self._open(create=True)
        return study, replace(self.ensure_baseline(study), stages_line=stages_line)

    def open_study(self, create: bool = True) -> optuna.Study:
        """Create or load the study (``create=False``: it must exist)."""
        return self._open(create)[0]

    def _open(self, create: bool) -> tuple[optuna.Study, str | None]:
        """The study, and what changed in its stages since its last run (None: nothing, or not a run)."""
        # ERROR: a failed or interrupted trial gets our one line, not Optuna's warning and traceback.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        storage = self.storage_backend()
        with self.lock():  # get-or-create: workers starting together create the study once
            study, stages_line = self._open_study(storage, create)
            fail_dead_trials(study)
        finished = len(study.get_trials(deepcopy=False, states=finished_states()))
        study.sampler = make_sampler(self.config, finished, self.worker)
        return study, stages_line

    def _open_study(self, storage: optuna.storages.BaseStorage, create: bool) -> tuple[optuna.Study, str | None]:
        exists = self.study_name in self.study_names()
        if not exists and not create:
            raise PipelineError(f"no study '{self.study_name}' in {self.storage_label}")
        if exists:
            study = optuna.load_study(study_name=self.study_name, storage=storage)
            if [d.name.lower() for d in study.directions] != self.objectives.directions():
                raise ConfigError(f"study '{self.study_name}' optimizes {study.metric_names} "
                                  f"({[d.name.lower() for d in study.directions]}), not "
                                  f"{self.objectives.metric_names()}: choose another --study-name")
        else:
            study = optuna.create_study(study_name=self.study_name, storage=storage,
                                        directions=self.objectives.directions())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(self.objectives.metric_names())
            study.set_user_attr(ATTR_SEARCH, self.config.model_dump(mode="json"))
        # a run of the study records its stages (``report`` only reads it)
        return study, self._record_stages(study) if create else None

    def _record_stages(self, study: optuna.Study) -> str | None:
        """Record the stages and runtimes this run searches (and, on the default name, the name the study answers
        to); what changed since the study's last run. A :class:`ConfigError` when they changed and the run did not
        accept it (``accept_plugin_change``), or when its trials used a stage that is not installed now."""
        current = [f"{n.name}:{n.op}" for n in self.pipeline.stage_nodes()]
        stored = study.user_attrs.get(ATTR_STAGES)
        installed = registered_stages()
        uninstalled = {s.partition(":")[2] for s in stored or () if s.partition(":")[2] not in installed}
        used = {raw.get("stage") for t in study.get_trials(deepcopy=False) if uninstalled
                for raw in t.user_attrs.get(ATTR_CONFIGS, {}).values() if raw}
        unreadable = [s for s in stored or () if s.partition(":")[2] in uninstalled & used]
        line = stage_change(self.study_name, stored, current, unreadable)
        runtimes = runtime_change(study.user_attrs.get(ATTR_RUNTIMES), self.runtimes)
        require_accepted(self.study_name, [c for c in (line, runtimes) if c], self.accept_plugin_change)
        if runtimes is not None:
            line = f"{line}; {runtimes}" if line else f"study {self.study_name}: {runtimes}"
        if stored != current:
            study.set_user_attr(ATTR_STAGES, current)
        if study.user_attrs.get(ATTR_RUNTIMES) != self.runtimes:
            study.set_user_attr(ATTR_RUNTIMES, list(self.runtimes))
        if self._given_name is None:
            key = study_name(self.spec, self.device, self.config, self.pipeline)
            if study.user_attrs.get(ATTR_STUDY_KEY) != key:
                study.set_user_attr(ATTR_STUDY_KEY, key)
        return line

    def latency_batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes a trial is timed at: the objective's alone, whatever the budget (another batch size
        would cost a compiled runtime two more compilations a trial and decides nothing; ``evaluate`` and
        ``apply`` time every spec batch size). ``--latency-batch 256`` need not be a spec batch size."""
        return (self.objectives.latency_batch,)

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            self._runner = Runner(
                self.pipeline, self.spec, self.device,
                cache=NodeCache(self.config.cache_mb * 1024**2, export_dir=cache_dir("exports")),
                latency=self.latency.settings,  # the settings the paired rounds use: one budget
                batch_sizes=self.latency_batch_sizes(),
                work_dir=results_dir() / "work" / self.study_name,
                reference=lambda: self.input_reference,
            )
        return self._runner

    @cached_property
    def reference(self) -> Callable[[], tuple[Tensor, Tensor]]:
        """The unoptimized model's outputs and the targets over the evaluation, computed on first use and kept: the
        self-check, the baseline and every trial's per-input view read this one pass."""
        return lazy_reference(self.runner.model, self.spec, self.device)

    @cached_property
    def input_reference(self) -> Reference:
        """What every trial is compared with input by input (:mod:`paretorch.pipeline.core.input_agreement`)."""
        return Reference.of(self.reference()[0], self.spec.output_kind, self.config.tail_cosine)

    @cached_property
    def rules(self) -> RuleOut:
        """What the unoptimized model's facts rule out (:mod:`paretorch.pipeline.search.rule_out`), read once."""
        stages = [self.pipeline.stage(n.name) for n in self.pipeline.stage_nodes()]
        return RuleOut.read(self.runner.model, self.spec, self.device, stages)

    def parts(self) -> StudyParts:
        """What the study's trials, their log and the front's exports use (the runner and the rule-out facts
        are built on first use: the model loads once)."""
        return StudyParts(self.spec, self.device, self.config, self.pipeline, self.objectives, tuple(self.runtimes),
                          self.study_name, self.runner, self.latency, self.rules)

    def ensure_baseline(self, study: optuna.Study) -> Prepared:
        """The stored baseline, or measure it now, store it and enqueue the baseline, the precision presets under
        every runtime (:mod:`paretorch.pipeline.search.presets`: cheap trials first) and the seed trials; with the lines
        of the self-check and of the presets enqueued (None where there were none)."""
        presets_line: str | None = None
        with self.lock():  # workers starting together measure and enqueue once
            reference = self.reference
            self_check_line = self.check_model(study, reference)
            stored = study.user_attrs.get(ATTR_BASELINE)
            if stored is not None:
                baseline = Baseline(**stored)
            else:
                result = self.runner.run({}, "eager", exports=False, known=Known(outputs=reference()))
                workload_ms = self.latency.baseline_alone().p50_ms if self.latency.workload is not None else None
                baseline = self.objectives.baseline_from(result.report, trial=None, workload_ms=workload_ms)
                study.set_user_attr(ATTR_BASELINE, json.loads(baseline.to_json()))
            self.objectives.threshold(baseline)  # a relative drop of a baseline <= 0 fails here, before any trial
            noise_line = self.check_noise_floor(study, baseline)
            self.machine = self.probe_machine(study)
            if not study.trials:
                self.enqueue(study, SeedRecipe(name="baseline"))
                plan = preset_seeds(self.config.presets, self.runtimes, self.preset_skip, self.machine)
                study.set_user_attr(ATTR_SKIPPED_PRESETS, plan.skipped)
                now, later = initial_queue(plan, self.config.seeds)
                enqueued = [seed for seed in now if self.enqueue(study, seed)]
                later = [seed for seed in later if not repeats(study, seed)]
                presets_line = plan.describe([s for s in enqueued if is_preset(s.name)], [s for s in later
                                                                                         if is_preset(s.name)])
                study.set_user_attr(ATTR_LATER_SEEDS, [seed.model_dump(mode="json") for seed in later])
            for seed in self.extra_seeds:
                self.enqueue(study, seed)
        return Prepared(baseline, self_check_line=self_check_line, presets_line=presets_line,
                        probe_line=self.machine.describe(), noise_line=noise_line)

    def check_noise_floor(self, study: optuna.Study, baseline: Baseline) -> str | None:
        """The stored noise floor of the study's metric, or measure it now (:mod:`paretorch.pipeline.core.noise_floor`):
        its warning line, None when the metric is above it."""
        stored, check = study.user_attrs.get(ATTR_NOISE_FLOOR), study.user_attrs.get(ATTR_SELF_CHECK)
        floor = NoiseFloor(**stored) if stored is not None else noise_floor(
            self.runner.model, self.spec, self.device, self.reference(), self.input_reference.output_kind,
            SelfCheck(**check).spread if check is not None else 0.0, self.objectives.threshold(baseline))
        if stored is None:
            study.set_user_attr(ATTR_NOISE_FLOOR, floor.to_dict())
        return floor.line(self.spec.metric.name)

    def probe_machine(self, study: optuna.Study) -> MachineProbe:
        """What pays (:mod:`paretorch.pipeline.core.machine_probe`), stored on the study; a resumed one reads it."""
        stored = study.user_attrs.get(ATTR_MACHINE_PROBE)
        if stored is not None:
            return MachineProbe(**stored)
        probe = probe_machine(self.device, *declared_probes(self.runtimes, self.device))
        study.set_user_attr(ATTR_MACHINE_PROBE, probe.to_dict())
        return probe

    def check_model(self, study: optuna.Study,
                    reference: Callable[[], tuple[Tensor, Tensor]] | None = None) -> str | None:
        """The stored self-check, or score the unoptimized model again, re-batched, now (the first scoring read from
        ``reference``, the outputs the baseline's evaluation reads too); raises if its metric moves, unless
        :attr:`allow_nondeterministic`. Recorded on the study once it passes (or is allowed). Its one line for the
        console (None: nothing to say)."""
        stored = study.user_attrs.get(ATTR_SELF_CHECK)
        check = SelfCheck(**stored) if stored is not None else self_check(
            self.runner.model, self.spec, self.device, reference=reference() if reference is not None else None)
        line = require_stable(check, self.spec.name, self.allow_nondeterministic)
        if stored is None:
            study.set_user_attr(ATTR_SELF_CHECK, check.to_dict())
        return line

    def enqueue(self, study: optuna.Study, seed: SeedRecipe) -> bool:
        """Enqueue ``seed`` unless a trial already carries the same seed; False if skipped (its stages are not in the
        pipeline or are disabled, or a stage says it is not worth a trial on this device:
        :meth:`paretorch.pipeline.core.stage.Stage.not_worthwhile`, or the seed is
        :attr:`~paretorch.pipeline.search.config.SeedRecipe.skip_where_unavailable` and this device cannot run it or the
        model's facts rule it out). Any other seed that cannot change this model is enqueued: it is answered before it
        runs, with its reason, and not counted (:mod:`paretorch.pipeline.search.rule_out`), so the user sees why."""
        available = {n.op for n in self.pipeline.stage_nodes() if n.name not in self.config.disabled}
        if any(raw.get("stage") not in available for raw in seed.stages):
            return False
        configs = [config_from_dict(dict(raw)) for raw in seed.stages]  # validates the seed's fields
        caps = capabilities(self.device)
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

    def probe_reason(self, stages: tuple[Mapping[str, object], ...], runtime: str) -> str | None:
        """Why the machine probe says a stage list does not pay under ``runtime`` here (None: it may)."""
        return probe_reason(self.machine, stages, runtime) if self.machine is not None else None

    def preset_skip(self, stages: tuple[dict[str, object], ...], runtime: str) -> str | None:
        """Why a preset's ``stages`` cannot be a trial under ``runtime`` here (None: they can): a stage not in
        the pipeline (or disabled), or the chain ruled out before it would run (slower only on this device,
        unable to change this model, not runnable on the device, or not by the runtime)."""
        available = {n.op for n in self.pipeline.stage_nodes() if n.name not in self.config.disabled}
        missing = sorted({str(raw.get("stage")) for raw in stages} - available)
        if missing:
            return f"not in this pipeline: {', '.join(missing)}"
        configs = [config_from_dict(dict(raw)) for raw in stages]
        return (self.probe_reason(stages, runtime) or self.rules.reason(configs) or self.rules.unavailable(configs)
                or self.rules.runtime_reason(configs, runtime))

    def seed_params(self, configs: list[StageConfig], runtime: str) -> dict[str, object]:
        """The Optuna params of a seed (so seeded trials appear in the sampler's plots), by stage node."""
        ctx = StageContext(spec=self.spec, device=self.device, facts=self.rules.facts)
        remaining = list(configs)
        parts: dict[str, dict[str, object] | None] = {}
        upstream: list[StageConfig] = []
        for node in self.pipeline.stage_nodes():
            exporting = self.pipeline.kind(node.name) == "export"
            if node.config is not None or node.name in self.config.disabled or exporting:
                continue
            config = next((c for c in remaining if c.stage == node.op), None)
            if config is not None:
                remaining.remove(config)
            ctx.upstream = tuple(upstream)
            parts[node.name] = stage_params(self.pipeline.stage(node.name).config_type, node.op, config, ctx)
            if config is not None:
                upstream.append(config)
        return {**merge_params(parts), **runtime_params(runtime, self.runtimes)}
