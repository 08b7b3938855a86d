"""One trial of a study, in four steps: choose -> rule out -> run -> record.

:class:`TrialObjective` is called by the trial loop (:func:`paretorch.pipeline.search.workers.run_trials`) with
each Optuna trial and returns a :class:`~paretorch.pipeline.search.record.TrialOutcome`: the trial's record goes
straight back to the loop, which hands it to the study callbacks (the trial's line and MLflow run,
then :class:`~paretorch.pipeline.search.proposals.Proposals`: the runtime sweep and compositions). The steps:

* :meth:`~TrialObjective.choose`: per-node configs and the runtime, from the trial's seed or each
  stage's ``suggest``;
* :meth:`~TrialObjective.rule_out`: a configuration that need not run (one that cannot change this
  model, :mod:`paretorch.pipeline.search.rule_out`, checked before any stage of the chain runs; a repeat of a
  measured recipe; a config another worker runs) ends here as a pruned trial with its reason;
* :meth:`~TrialObjective.run`: costly stages screened at low fidelity first (:meth:`~TrialObjective.screen`,
  :mod:`paretorch.pipeline.search.screening`), then the runner applies the stages and evaluates, then the paired
  latency; :meth:`Objectives.verdict <paretorch.pipeline.search.objectives.Objectives.verdict>` judges the metric;
* :meth:`~TrialObjective.record`: the :class:`TrialRecord` is written to the Optuna trial (user
  attrs, constraint, dashboard note) and indexed for later repeats.

Ctrl-C (:mod:`paretorch.pipeline.search.interrupt`): an exception raised after SIGINT arrived is the interrupt,
never the trial's reason; the trial loop stops.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState
from torch import Tensor

from paretorch.pipeline.core.device import describe
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.evaluate import Known
from paretorch.pipeline.core.paired import PairedLatency
from paretorch.pipeline.core.stage import StageConfig, StageContext, config_from_dict
from paretorch.pipeline.engine.recipe import configs_to_json
from paretorch.pipeline.engine.run_result import RunResult
from paretorch.pipeline.search.budgets import budget_metrics
from paretorch.pipeline.search.dashboard import note_infeasible, set_constraints
from paretorch.pipeline.search.dead_ends import RuntimeGains
from paretorch.pipeline.search.duplicates import RepeatIndex, model_configs, recipe_key
from paretorch.pipeline.search.insight import sensitivity_tables
from paretorch.pipeline.search.interrupt import Interrupts
from paretorch.pipeline.search.objectives import (
    ATTR_CONFIGS,
    ATTR_ESTIMATE,
    ATTR_RUNTIME,
    ATTR_SEED,
    ATTR_SEED_PARAMS,
    ATTR_SEED_RECIPE,
    CONSTRAINT_NAME,
    Baseline,
)
from paretorch.pipeline.search.probe import FrontReferences, behind_front, front_references
from paretorch.pipeline.search.record import (
    COMPLETE,
    FAIL,
    FULL_FIDELITY,
    PROBE_FIDELITY,
    PRUNED,
    TrialOutcome,
    TrialRecord,
)
from paretorch.pipeline.search.recorded import RECORDED, recorded
from paretorch.pipeline.search.rule_out import study_choices
from paretorch.pipeline.search.screening import CostlyClock, Screened, Screening, record_screen
from paretorch.pipeline.search.seeding import stage_params
from paretorch.pipeline.search.study_latency import BASELINE_RUNTIME
from paretorch.pipeline.search.subset import SubsetJudge, subset_plan
from paretorch.pipeline.search.workers import claim_config

if TYPE_CHECKING:
    from paretorch.pipeline.search.study_parts import StudyParts

#: A record of this trial with its outcome fields still to fill (state, metrics or reason).
Draft = Callable[..., TrialRecord]


class TrialObjective:
    """Runs the trials of one study against its measured baseline (see the module docstring)."""

    def __init__(self, parts: StudyParts, baseline: Baseline, interrupts: Interrupts | None = None) -> None:
        self.parts = parts
        self.baseline = baseline
        self.interrupts = interrupts or Interrupts()
        self.exports = [n.name for n in parts.pipeline.export_nodes()]
        self._repeats: RepeatIndex | None = None
        self._choices: dict[str, tuple[object, ...]] | None = None
        #: Costly stages at low fidelity first (paretorch.pipeline.search.screening), through the study's runner, within
        #: their share of this run's time (the clock starts now).
        clock = CostlyClock(parts.config.costly_share,
                            lambda: {name: tally.seconds for name, tally in parts.runner.stage_tallies.items()})
        plan = subset_plan(parts.spec)
        #: Scores a trial on a subset of the evaluation first (paretorch.pipeline.search.subset); None: always in full.
        self.subset = None if plan is None else SubsetJudge(
            parts.spec, parts.device, plan, lambda *inputs: parts.latency.baseline()(*inputs),
            parts.objectives.tail, parts.runner.reference)
        self.screening = Screening(parts.objectives, lambda configs, runtime: parts.runner.run(
            configs, runtime, exports=False).report, self.exports, clock=clock)

    def __call__(self, trial: optuna.Trial) -> TrialOutcome:
        """Run one trial: its record and values, or ``KeyboardInterrupt`` if Ctrl-C arrived meanwhile."""
        start = time.perf_counter()
        with self.interrupts.watch():
            configs, runtime = self.choose(trial)
            self.announce(trial, configs, runtime)
            draft: Draft = self._draft(trial, configs, runtime)
            outcome = self.rule_out(trial, configs, runtime, draft)
            if outcome is None:
                outcome = self.run(trial, configs, runtime, draft, start)
            self.interrupts.check()  # a tracer may have swallowed the interrupt and finished the step
            return self.record(trial, outcome)

    # ------------------------------------------------------------------ choose

    def choose(self, trial: optuna.Trial) -> tuple[dict[str, StageConfig | None], str]:
        """Per-node configs and the runtime: from the trial's seed, else each stage's ``suggest``."""
        parts = self.parts
        seed = trial.user_attrs.get(ATTR_SEED_RECIPE)
        seeded = [config_from_dict(raw) for raw in seed["stages"]] if seed else None
        fixed = dict(trial.user_attrs.get(ATTR_SEED_PARAMS, {}))
        if self._choices is None:  # the study's categorical choices before this process (kept: Optuna's rule)
            self._choices = study_choices(trial.study.get_trials(deepcopy=False))
        ctx = StageContext(spec=parts.spec, device=parts.device, facts=parts.rules.facts,
                           study_choices=self._choices)
        configs: dict[str, StageConfig | None] = {}
        upstream: list[StageConfig] = []
        for node in parts.pipeline.stage_nodes():
            exporting = parts.pipeline.kind(node.name) == "export"
            if node.config is not None:
                config: StageConfig | None = node.config
            elif node.name in parts.config.disabled:
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
                config = parts.pipeline.stage(node.name).config_type.suggest(trial, ctx)
            configs[node.name] = config
            if config is not None and not exporting:
                upstream.append(config)
        return configs, self._runtime(trial, seed, fixed)

    @staticmethod
    def announce(trial: optuna.Trial, configs: dict[str, StageConfig | None], runtime: str) -> None:
        """Store what the trial asked for as it starts (its record stores it again when it ends): a trial that never
        ends (interrupted, its process killed) still names its recipe when a resumed study runs it again
        (:mod:`paretorch.pipeline.search.reruns`)."""
        trial.set_user_attr(ATTR_CONFIGS, configs_to_json(configs))
        trial.set_user_attr(ATTR_RUNTIME, runtime)

    def _runtime(self, trial: optuna.Trial, seed: dict[str, object] | None, fixed: dict[str, object]) -> str:
        # A study keeps the runtime choices it began with (Optuna cannot change them): one begun before a
        # runtime joined the defaults, or on a machine with other onnxruntime providers, answers a runtime
        # not available now before it runs (rule_out).
        runtimes = [str(r) for r in (self._choices or {}).get("runtime", self.parts.runtimes)]
        if seed and "runtime" in fixed:  # a seed's runtime the study's choices lack runs unrecorded as a param
            return str(trial.suggest_categorical("runtime", runtimes) if fixed["runtime"] in runtimes
                       else fixed["runtime"])
        if seed:
            return str(seed["runtime"])
        if len(runtimes) > 1:
            return str(trial.suggest_categorical("runtime", runtimes))
        return runtimes[0]

    def _register_seed_params(self, trial: optuna.Trial, node: str, config: StageConfig | None,
                              ctx: StageContext, fixed: dict[str, object]) -> None:
        """Let the stage's ``suggest`` record the params enqueued with a seed (it returns the seed's config)."""
        stage = self.parts.pipeline.stage(node)
        params = stage_params(stage.config_type, stage.config_type.stage, config, ctx)
        if params and all(fixed.get(k, object()) == v for k, v in params.items()):
            stage.config_type.suggest(trial, ctx)

    def _draft(self, trial: optuna.Trial, configs: dict[str, StageConfig | None], runtime: str) -> Draft:
        start_ms = int(trial.datetime_start.timestamp() * 1000) if trial.datetime_start else None
        return partial(TrialRecord, number=trial.number, runtime=runtime, configs=configs,
                       seed=trial.user_attrs.get(ATTR_SEED), start_ms=start_ms)

    # ------------------------------------------------------------------ rule out

    def rule_out(self, trial: optuna.Trial, configs: dict[str, StageConfig | None], runtime: str,
                 draft: Draft) -> TrialOutcome | None:
        """A pruned outcome with its reason for a configuration that need not run, else None (run it)."""
        chain = model_configs(configs, self.exports)
        if runtime not in self.parts.runtimes:
            return TrialOutcome(draft(state=PRUNED, ruled_out=f"runtime {runtime} is not available here (the study "
                                      f"offered it before; now: {', '.join(self.parts.runtimes)})"))
        if (reason := self.parts.rules.reason(chain) or self.parts.rules.runtime_reason(chain, runtime)) is not None:
            return TrialOutcome(draft(state=PRUNED, ruled_out=reason))
        estimate = trial.user_attrs.get(ATTR_ESTIMATE)  # a proposal: the trials since may make it a dead end
        if estimate and (reason := self.gains(trial.study).dead_end_reason(estimate, runtime)) is not None:
            return TrialOutcome(draft(state=PRUNED, ruled_out=reason))
        original = self.repeats(trial.study).find(recipe_key(model_configs(configs, self.exports), runtime))
        if original is None:  # another worker runs (or ran) the same config: do not run it twice
            original = claim_config(trial, configs_to_json(configs), runtime)
        if original is not None:
            return TrialOutcome(draft(state=PRUNED, repeat_of=original))
        if (reason := self.parts.rules.unavailable(model_configs(configs, self.exports))) is not None:
            return TrialOutcome(draft(state=PRUNED, infeasible=reason))  # a trial, ended before its chain runs
        return None

    def measured(self, study: optuna.Study, configs: Sequence[StageConfig | None], runtime: str) -> bool:
        """Whether a trial measured (or was infeasible for) these model stages under ``runtime``."""
        return self.repeats(study).find(recipe_key(configs, runtime)) is not None

    def repeats(self, study: optuna.Study) -> RepeatIndex:
        """The recipes measured so far (built from storage once, then kept up to date)."""
        if self._repeats is None:
            self._repeats = RepeatIndex()
            for done in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)),
                               key=lambda t: t.number):
                self._index_repeat(TrialRecord.from_trial(done))
        return self._repeats

    def _index_repeat(self, record: TrialRecord) -> None:
        """Index a measured trial (complete, or infeasible for its recipe) under its requested and resolved keys."""
        if self._repeats is None or record.repeat_of is not None or record.state == FAIL:
            return
        resolved = recipe_key(record.recipe.model_stages(), record.runtime) if record.recipe else None
        requested = recipe_key(model_configs(record.configs, self.exports), record.runtime)
        self._repeats.add(record.number, [requested, resolved])

    # ------------------------------------------------------------------ run

    def run(self, trial: optuna.Trial, configs: dict[str, StageConfig | None], runtime: str, draft: Draft,
            start: float) -> TrialOutcome:
        """Screen the costly stages at low fidelity (:meth:`screen`), apply the stages, time the model paired with
        the baseline (the probe, :mod:`paretorch.pipeline.search.probe`: one far behind the front ends here, unscored),
        then evaluate it (its latency is the probe's, not timed again) and judge it. An infeasible config is a pruned
        outcome, an exception a failed one, unless Ctrl-C came first (then it is raised)."""
        parts = self.parts
        try:
            screened = self.screen(trial, configs, runtime)
            if screened is not None and not screened.passed:  # the screen ended the trial before its full cost
                return TrialOutcome(draft(state=PRUNED, infeasible=screened.out_reason(),
                                          seconds={"screening": screened.seconds,
                                                   "trial": time.perf_counter() - start}))
            fn, staged = parts.runner.prepared_run(configs, runtime)
            paired_start = time.perf_counter()
            front = front_references(trial.study)
            unchanged = all(config is None for config in model_configs(configs, self.exports))
            timing = parts.latency.probe(fn, runtime, front.stop_rule(unchanged),
                                         itself=unchanged and runtime == BASELINE_RUNTIME)
            paired = timing.paired
            paired_seconds = time.perf_counter() - paired_start
            seconds = {**staged.seconds, **({"screening": screened.seconds} if screened else {}),
                       "paired_latency": paired_seconds}
            stopped = self.stop_early(trial, configs, runtime, draft, fn, staged, paired, front, unchanged,
                                      {**seconds, "trial": time.perf_counter() - start})
            if stopped is not None:
                return stopped
            # On a workload the probe timed raw inputs to host outputs: the model call is timed alone in the
            # evaluation, the figure beside it (paretorch.pipeline.core.workload).
            known_latency = {parts.objectives.latency_batch: timing.stats} if parts.latency.workload is None else {}
            result = parts.runner.run(configs, runtime, exports=parts.config.exports == "every_trial",
                                      known=Known(fn, known_latency))
        except InfeasibleConfig as exc:
            self.interrupts.check(exc)
            return TrialOutcome(draft(state=PRUNED, infeasible=exc.reason))
        except Exception as exc:
            self.interrupts.check(exc)
            return TrialOutcome(draft(state=FAIL, error=traceback.format_exc()), failure=exc)
        report = result.report
        verdict = parts.objectives.verdict(self.baseline, report.metric_value, paired.unstable, report.extra,
                                            report.metric_resamples)
        metrics = parts.objectives.trial_metrics(report, self.baseline, paired)
        measured = recorded(report, metrics, parts.objectives.latency_batch, describe(parts.device))
        recipe = result.recipe(parts.spec.name, deferred_exports={n: configs.get(n) for n in self.exports},
                               metadata={"study": parts.study_name, "trial": trial.number, RECORDED: measured})
        run_seconds = {k: v + staged.seconds.get(k, 0.0) for k, v in result.seconds.items()}
        record = draft(
            state=COMPLETE, recipe=recipe, metrics={**metrics, **budget_metrics(recipe.stages, verdict.headroom)},
            seconds={**run_seconds, **({"screening": screened.seconds} if screened else {}),
                     "paired_latency": seconds["paired_latency"], "trial": time.perf_counter() - start},
            cache={"hits": result.cache_hits + staged.cache_hits, "misses": result.cache_misses + staged.cache_misses},
            feasible=verdict.feasible, over_drop=verdict.reason, latency_unstable=verdict.unstable,
            uncertain=verdict.uncertain, tables=sensitivity_tables(result.nodes), fidelity=FULL_FIDELITY,
            worst_inputs=report.worst_inputs,
        )
        values = parts.objectives.values(report, metrics[parts.objectives.latency_key])
        return TrialOutcome(record, values=values, verdict=verdict)

    def stop_early(self, trial: optuna.Trial, configs: dict[str, StageConfig | None], runtime: str, draft: Draft,
                   fn: Callable[..., Tensor], staged: RunResult, paired: PairedLatency, front: FrontReferences,
                   unchanged: bool, seconds: dict[str, float]) -> TrialOutcome | None:
        """The outcome of a trial decided before its full evaluation (None: score it in full): far behind the front
        by its probe (not scored; its resolved recipe kept, so its params say what ran), or clearly over the allowed
        drop on a subset of the evaluation data. ``unchanged``: a runtime alone on the unoptimized model."""
        parts = self.parts
        if (behind := behind_front(paired, front, runtime, self.gains(trial.study).plain.get(runtime),
                                   unchanged=unchanged)) is not None:
            recipe = staged.recipe(parts.spec.name, deferred_exports={n: configs.get(n) for n in self.exports},
                                   metadata={"study": parts.study_name, "trial": trial.number})
            return TrialOutcome(draft(state=PRUNED, infeasible=behind, metrics=paired.metrics(), seconds=seconds,
                                      fidelity=PROBE_FIDELITY, recipe=recipe,
                                      cache={"hits": staged.cache_hits, "misses": staged.cache_misses}))
        if self.subset is None:
            return None
        allowed = parts.objectives.threshold(self.baseline)
        judged = self.subset.judge(fn, runtime, parts.objectives.latency_batch, allowed)
        if judged.over is None:
            return None
        return TrialOutcome(draft(state=PRUNED, infeasible=judged.over, seconds=seconds, fidelity=judged.fidelity,
                                  metrics={**paired.metrics(), "metric_drop_subset": judged.drop}))

    def gains(self, study: optuna.Study) -> RuntimeGains:
        """What the study's measured trials say about each runtime (:mod:`paretorch.pipeline.search.dead_ends`)."""
        return RuntimeGains.of(study, lambda record: bool(record.feasible))

    def screen(self, trial: optuna.Trial, configs: dict[str, StageConfig | None], runtime: str) -> Screened | None:
        """The low-fidelity screen of the trial's costly stages, recorded on the trial (None: not screened)."""
        if not self.parts.config.screening:
            return None
        trials = trial.study.get_trials(deepcopy=False)
        return record_screen(trial, self.screening.screen(trials, configs, runtime, self.baseline))

    # ------------------------------------------------------------------ record

    def record(self, trial: optuna.Trial, outcome: TrialOutcome) -> TrialOutcome:
        """Write the record to the Optuna trial (user attrs; a complete trial's constraint and, when it is not
        feasible, its dashboard note) and index it for repeats."""
        record = outcome.record
        self._index_repeat(record)
        for key, value in record.user_attrs().items():
            trial.set_user_attr(key, value)
        if outcome.verdict is not None:
            set_constraints(trial, {CONSTRAINT_NAME: outcome.verdict.constraint})
            if (why := outcome.verdict.reason or outcome.verdict.unstable) is not None:
                note_infeasible(trial, why)
        return outcome
