"""One study: the trial objective (suggest, run, measure, constrain), the baseline and the seeds."""

from __future__ import annotations

import json
import time
import traceback
import warnings
from dataclasses import dataclass, field
from functools import partial

import optuna
import torch
from optuna.trial import FrozenTrial, TrialState

from pipeline.core.device import capabilities
from pipeline.core.errors import ConfigError, InfeasibleConfig, PipelineError
from pipeline.core.paths import cache_dir, results_dir
from pipeline.core.runtime import available_runtimes
from pipeline.core.secrets import mask_secrets
from pipeline.core.self_check import SelfCheck, require_stable, self_check
from pipeline.core.spec import ModelSpec
from pipeline.core.stage import StageConfig, StageContext, config_from_dict, stage_for
from pipeline.engine.cache import NodeCache
from pipeline.engine.graph import load_pipeline
from pipeline.engine.recipe import configs_to_json
from pipeline.engine.runner import TIME_CATEGORIES, Runner
from pipeline.search.budgets import budget_metrics
from pipeline.search.config import (
    LATENCY_BUDGETS,
    SearchConfig,
    SeedRecipe,
    default_storage,
    finished_states,
    make_sampler,
    study_name,
)
from pipeline.search.dashboard import note_infeasible, set_constraints
from pipeline.search.duplicates import RepeatIndex, model_configs, recipe_key
from pipeline.search.insight import sensitivity_tables
from pipeline.search.objectives import (
    ATTR_BASELINE,
    ATTR_SEARCH,
    ATTR_SEED,
    ATTR_SEED_PARAMS,
    ATTR_SEED_RECIPE,
    CONSTRAINT_NAME,
    Baseline,
    Objectives,
)
from pipeline.search.record import COMPLETE, FAIL, PRUNED, TrialRecord
from pipeline.search.seeding import merge_params, runtime_params, stage_params
from pipeline.search.storage import StudyLock, fail_dead_trials, open_storage
from pipeline.search.study_latency import StudyLatency
from pipeline.search.sweep import RuntimeSweepIndex
from pipeline.search.workers import claim_config

#: Study user attr: the unoptimized model's self-check (pipeline.core.self_check), measured once per study.
ATTR_SELF_CHECK = "self_check"


@dataclass
class SearchTimes:
    """Where the wall time went (seconds)."""

    wall: float = 0.0
    by_category: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_CATEGORIES, 0.0))

    @property
    def work(self) -> float:
        return sum(self.by_category.values())

    @property
    def other(self) -> float:
        return max(0.0, self.wall - self.work)

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in self.by_category.items())
        share = 100.0 * self.other / self.wall if self.wall else 0.0
        return f"{self.wall:.1f} s in all: {parts}; search, tracking and I/O {self.other:.1f} s ({share:.1f}%)"


class Search:
    """One study: its objectives, runner, tracker and the trial loop."""

    def __init__(self, spec: ModelSpec, device: torch.device, config: SearchConfig, storage: str | None = None,
                 tracking_uri: str | None = None, track: bool = True, name: str | None = None) -> None:
        self.spec = spec
        self.device = device
        self.config = config
        self.pipeline = load_pipeline(config.pipeline)
        stage_names = {n.name for n in self.pipeline.stage_nodes()}
        unknown = sorted(set(config.disabled) - stage_names)
        if unknown:
            raise ConfigError(f"cannot disable {unknown}: the pipeline's stage nodes are {sorted(stage_names)}")
        self.objectives = Objectives.create(spec, config.objectives, config.max_drop, config.latency_batch)
        possible = available_runtimes(device)
        self.runtimes = [r for r in config.runtimes if r in possible]
        if not self.runtimes:
            raise ConfigError(f"none of the runtimes {list(config.runtimes)} runs on {device.type} "
                              f"(available: {', '.join(possible)})")
        self.study_name = name or study_name(spec, device, config, self.pipeline)
        self.storage = storage or default_storage()
        self.tracking_uri = tracking_uri
        self.track = track
        self.times = SearchTimes()
        self._runner: Runner | None = None
        self._storage: optuna.storages.BaseStorage | None = None
        self.baseline: Baseline | None = None
        #: Records of the trials this process ran, by number (see :meth:`record`).
        self.records: dict[int, TrialRecord] = {}
        self._sweep: RuntimeSweepIndex | None = None
        self._repeats: RepeatIndex | None = None
        #: Seeds enqueued on every run (``--enqueue RECIPE``), after the config's seeds; duplicates skipped.
        self.extra_seeds: list[SeedRecipe] = []
        #: This process's index among the study's workers (0 when alone): moves the sampler's seed.
        self.worker = 0
        #: Go on when the unoptimized model's metric moves between passes (``--allow-nondeterministic``).
        self.allow_nondeterministic = False
        #: The self-check's one line for the console (set by :meth:`ensure_baseline`).
        self.self_check_line: str | None = None
        #: Paired latency of the trials against the baseline (its timer and CPU clock are injectable).
        self.latency = StudyLatency(spec, device, self.objectives.latency_batch, lambda: self.runner)

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
        """The study's lock, shared by all workers (see :mod:`pipeline.search.storage`)."""
        return StudyLock(self.storage, self.storage_backend(), self.study_name)

    def study_names(self) -> list[str]:
        return [s.study_name for s in self.storage_backend().get_all_studies()]

    def open_study(self, create: bool = True) -> optuna.Study:
        """Create or load the study (``create=False``: it must exist)."""

        # ERROR: a failed or interrupted trial gets our one line, not Optuna's warning and traceback.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        storage = self.storage_backend()
        with self.lock():  # get-or-create: workers starting together create the study once
            study = self._open_study(storage, create)
            fail_dead_trials(study)
        finished = len(study.get_trials(deepcopy=False, states=finished_states()))
        study.sampler = make_sampler(self.config, finished, self.worker)
        return study

    def _open_study(self, storage: optuna.storages.BaseStorage, create: bool) -> optuna.Study:
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
        return study

    def latency_batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes a trial measures: the objective's alone on the quick budget, else the
        spec's latency batch sizes plus the objective's (``--latency-batch 256`` need not be one of them)."""
        objective = self.objectives.latency_batch
        if self.config.latency_budget == "quick":
            return (objective,)
        return tuple(dict.fromkeys((*self.spec.latency_batch_sizes, objective)))

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            self._runner = Runner(
                self.pipeline, self.spec, self.device,
                cache=NodeCache(self.config.cache_mb * 1024**2, export_dir=cache_dir("exports")),
                latency=LATENCY_BUDGETS[self.config.latency_budget],
                batch_sizes=self.latency_batch_sizes(),
                work_dir=results_dir() / "work" / self.study_name,
            )
        return self._runner

    def ensure_baseline(self, study: optuna.Study) -> Baseline:
        """The stored baseline, or measure it now, store it and enqueue the baseline and seed trials."""
        with self.lock():  # workers starting together measure and enqueue once
            self.check_model(study)
            stored = study.user_attrs.get(ATTR_BASELINE)
            if stored is not None:
                self.baseline = Baseline(**stored)
            else:
                result = self.runner.run({}, "eager", exports=False)
                self.baseline = self.objectives.baseline_from(result.report, trial=None)
                study.set_user_attr(ATTR_BASELINE, json.loads(self.baseline.to_json()))
            self.objectives.threshold(self.baseline)  # a relative drop of a baseline <= 0 fails here, before any trial
            if not study.trials:
                self.enqueue(study, SeedRecipe(name="baseline"))
                for seed in self.config.seeds:
                    self.enqueue(study, seed)
            for seed in self.extra_seeds:
                self.enqueue(study, seed)
        return self.baseline

    def check_model(self, study: optuna.Study) -> None:
        """The stored self-check, or score the unoptimized model twice and re-batched now; raises if its
        metric moves, unless :attr:`allow_nondeterministic`. Recorded on the study once it passes (or is allowed)."""
        stored = study.user_attrs.get(ATTR_SELF_CHECK)
        check = SelfCheck(**stored) if stored is not None else self_check(self.runner.model, self.spec, self.device)
        self.self_check_line = require_stable(check, self.spec.name, self.allow_nondeterministic)
        if stored is None:
            study.set_user_attr(ATTR_SELF_CHECK, check.to_dict())

    def enqueue(self, study: optuna.Study, seed: SeedRecipe) -> bool:
        """Enqueue ``seed`` unless a trial already carries the same seed; False if skipped
        (its stages are not in the pipeline or are disabled, or a stage says it is not
        worth a trial on this device: :meth:`pipeline.core.stage.Stage.not_worthwhile`)."""
        available = {n.op for n in self.pipeline.stage_nodes() if n.name not in self.config.disabled}
        if any(raw.get("stage") not in available for raw in seed.stages):
            return False
        configs = [config_from_dict(dict(raw)) for raw in seed.stages]  # validates the seed's fields
        caps = capabilities(self.device)
        if any(stage_for(c).not_worthwhile(c, caps) for c in configs):
            return False  # the capability table says it can only be slower here
        payload = {"runtime": seed.runtime, "stages": [c.to_dict() for c in configs]}
        if any(t.user_attrs.get(ATTR_SEED_RECIPE) == payload for t in study.get_trials(deepcopy=False)):
            return False
        params = self.seed_params(configs, seed.runtime)
        study.enqueue_trial(params, user_attrs={ATTR_SEED: seed.name, ATTR_SEED_RECIPE: payload,
                                                ATTR_SEED_PARAMS: params})
        return True

    def seed_params(self, configs: list[StageConfig], runtime: str) -> dict[str, object]:
        """The Optuna params of a seed (so seeded trials appear in the sampler's plots), by stage node."""
        ctx = StageContext(spec=self.spec, device=self.device)
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

    def sweep_runtimes(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """When ``trial`` is the fastest trial within the allowed drop so far, enqueue its
        resolved recipe under each runtime not yet tried with the same stages (a calibrated
        AMP policy replays, with no calibration). A study callback.

        The runtime barely interacts with the stages, yet a sampler needs many trials to
        pair the best stages with the best runtime: with MiniLM on one CPU core, a
        30-trial TPE search never tried its best stages (bf16 AMP) under torch.compile.
        The sweep keeps its own index (stages -> runtimes tried, fastest feasible latency),
        updated once per trial, so it does not re-read the study."""
        index = self._sweep_index(study)
        record = self.record(trial)
        latency = index.add(record, self._feasible_latency(record))
        if latency is None or latency > index.fastest or len(self.runtimes) < 2 or record.recipe is None:
            return
        tried = index.runtimes.get(record.stages_key or "", set())
        seed = partial(SeedRecipe, name=f"runtime-sweep-of-trial-{trial.number}",
                       stages=tuple(c.to_dict() for c in record.recipe.model_stages()))
        for runtime in self.runtimes:
            if runtime not in tried:
                self.enqueue(study, seed(runtime=runtime))

    def _sweep_index(self, study: optuna.Study) -> RuntimeSweepIndex:
        if self._sweep is None:
            self._sweep = RuntimeSweepIndex()
            for done in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                record = self.record(done)
                self._sweep.add(record, self._feasible_latency(record))
        return self._sweep

    def _feasible_latency(self, record: TrialRecord) -> float | None:
        """The trial's objective latency if it completed within the allowed drop, else None."""
        value = record.metrics.get(self.spec.metric.name)
        if record.state != COMPLETE or value is None or self.baseline is None:
            return None
        if record.latency_unstable is not None or not self.objectives.verdict(self.baseline, value).feasible:
            return None
        latency = record.metrics.get(self.objectives.latency_key)
        return float(latency) if latency is not None else None

    # ------------------------------------------------------------------ one trial

    def choose(self, trial: optuna.Trial) -> tuple[dict[str, StageConfig | None], str]:
        """Per-node configs and the runtime: from the trial's seed, else each stage's ``suggest``."""
        seed = trial.user_attrs.get(ATTR_SEED_RECIPE)
        seeded = [config_from_dict(raw) for raw in seed["stages"]] if seed else None
        fixed = dict(trial.user_attrs.get(ATTR_SEED_PARAMS, {}))
        ctx = StageContext(spec=self.spec, device=self.device)
        configs: dict[str, StageConfig | None] = {}
        upstream: list[StageConfig] = []
        for node in self.pipeline.stage_nodes():
            exporting = self.pipeline.kind(node.name) == "export"
            if node.config is not None:
                config: StageConfig | None = node.config
            elif node.name in self.config.disabled:
                config = None
            elif seeded is not None and (not exporting or any(c.stage == node.op for c in seeded)):
                config = next((c for c in seeded if c.stage == node.op), None)
                if config is not None:
                    seeded.remove(config)
                if not exporting:
                    ctx.upstream = tuple(upstream)
                    self._register_seed_params(trial, node.name, config, ctx, fixed)
            else:
                ctx.upstream = tuple(upstream)
                config = self.pipeline.stage(node.name).config_type.suggest(trial, ctx)
            configs[node.name] = config
            if config is not None and not exporting:
                upstream.append(config)
        if seed and "runtime" in fixed:
            runtime = str(trial.suggest_categorical("runtime", self.runtimes))
        elif seed:
            runtime = str(seed["runtime"])
        elif len(self.runtimes) > 1:
            runtime = str(trial.suggest_categorical("runtime", self.runtimes))
        else:
            runtime = self.runtimes[0]
        return configs, runtime

    def _register_seed_params(self, trial: optuna.Trial, node: str, config: StageConfig | None,
                              ctx: StageContext, fixed: dict[str, object]) -> None:
        """Let the stage's ``suggest`` record the params enqueued with a seed (it returns the seed's config)."""
        stage = self.pipeline.stage(node)
        params = stage_params(stage.config_type, stage.config_type.stage, config, ctx)
        if params and all(fixed.get(k, object()) == v for k, v in params.items()):
            stage.config_type.suggest(trial, ctx)

    def repeats(self, study: optuna.Study) -> RepeatIndex:
        """The recipes measured so far (built from storage once, then kept up to date)."""
        if self._repeats is None:
            self._repeats = RepeatIndex()
            for done in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)),
                               key=lambda t: t.number):
                self._index_repeat(self.record(done))
        return self._repeats

    def _index_repeat(self, record: TrialRecord) -> None:
        """Index a measured trial (complete, or infeasible for its recipe) under its requested and resolved keys."""
        if self._repeats is None or record.repeat_of is not None or record.state == FAIL:
            return
        exports = [n.name for n in self.pipeline.export_nodes()]
        resolved = recipe_key(record.recipe.model_stages(), record.runtime) if record.recipe else None
        self._repeats.add(record.number, [recipe_key(model_configs(record.configs, exports), record.runtime), resolved])

    def objective(self, trial: optuna.Trial) -> tuple[float, ...]:
        """Run one trial; its :class:`TrialRecord` is kept in :attr:`records` and written to Optuna."""
        if self.baseline is None:
            raise PipelineError("the baseline must be measured before trials run (call ensure_baseline)")
        start = time.perf_counter()
        configs, runtime = self.choose(trial)
        record = partial(TrialRecord, number=trial.number, runtime=runtime, configs=configs,
                         seed=trial.user_attrs.get(ATTR_SEED),
                         start_ms=int(trial.datetime_start.timestamp() * 1000) if trial.datetime_start else None)
        exports = [n.name for n in self.pipeline.export_nodes()]
        original = self.repeats(trial.study).find(recipe_key(model_configs(configs, exports), runtime))
        if original is not None:
            self._store(trial, record(state=PRUNED, repeat_of=original))
            raise optuna.TrialPruned(f"repeat of trial {original}")
        earlier = claim_config(trial, configs_to_json(configs), runtime)
        if earlier is not None:  # another worker runs (or ran) the same config: do not run it twice
            self._store(trial, record(state=PRUNED, repeat_of=earlier))
            raise optuna.TrialPruned(f"repeat of trial {earlier}")
        try:
            result = self.runner.run(configs, runtime, exports=self.config.exports == "every_trial")
        except InfeasibleConfig as exc:
            self._store(trial, record(state=PRUNED, infeasible=exc.reason))
            raise optuna.TrialPruned(exc.reason) from exc
        except Exception:
            self._store(trial, record(state=FAIL, error=traceback.format_exc()))
            raise
        report = result.report
        recipe = result.recipe(self.spec.name, deferred_exports={n: configs.get(n) for n in exports},
                               metadata={"study": self.study_name, "trial": trial.number})
        paired_start = time.perf_counter()
        try:
            paired = self.latency.measure(configs, runtime, result)
        except Exception:
            self._store(trial, record(state=FAIL, error=traceback.format_exc()))
            raise
        paired_seconds = time.perf_counter() - paired_start
        verdict = self.objectives.verdict(self.baseline, report.metric_value, paired.unstable)
        metrics = self.objectives.trial_metrics(report, self.baseline, paired)
        self._store(trial, record(
            state=COMPLETE, recipe=recipe,
            metrics={**metrics,
                     **budget_metrics(recipe.stages, self.objectives.constraint(self.baseline, report.metric_value))},
            seconds={**result.seconds, "paired_latency": paired_seconds, "trial": time.perf_counter() - start},
            cache={"hits": result.cache_hits, "misses": result.cache_misses}, feasible=verdict.feasible,
            over_drop=verdict.reason, latency_unstable=verdict.unstable,
            tables=sensitivity_tables(result.nodes),
        ))
        set_constraints(trial, {CONSTRAINT_NAME: verdict.constraint})
        if (why := verdict.reason or verdict.unstable) is not None:
            note_infeasible(trial, why)
        return self.objectives.values(report, metrics[self.objectives.latency_key])

    def _store(self, trial: optuna.Trial, record: TrialRecord) -> None:
        self.records[record.number] = record
        self._index_repeat(record)
        for key, value in record.user_attrs().items():
            trial.set_user_attr(key, value)

    def record(self, trial: FrozenTrial) -> TrialRecord:
        """The record of a finished trial: the one this process built, else read from storage."""
        return self.records.get(trial.number) or TrialRecord.from_trial(trial)
