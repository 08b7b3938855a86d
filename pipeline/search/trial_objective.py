"""One trial of a study: choose its configs, walk its declared steps, record its outcome.

:class:`TrialObjective` is called by the trial loop (:func:`paretorch.pipeline.search.workers.run_trials`) with
each Optuna trial and returns a :class:`~paretorch.pipeline.search.record.TrialOutcome`: the trial's record goes
straight back to the loop, which hands it to the study callbacks (the trial's line and MLflow run,
then :class:`~paretorch.pipeline.search.proposals.Proposals`: the runtime sweep and compositions). A trial:

* :meth:`~TrialObjective.choose`: per-node configs and the runtime, from the trial's seed or each
  stage's ``suggest``;
* its plan, :data:`~paretorch.pipeline.search.trial_steps.TRIAL_STEPS` (rule out, screen, probe, subset, evaluate,
  judge: :mod:`paretorch.pipeline.search.trial_steps`), walked from the trial's first state until a step returns its
  outcome;
* :meth:`~TrialObjective.record`: the :class:`TrialRecord` is written to the Optuna trial (user
  attrs, constraint, dashboard note) and indexed for later repeats.

Ctrl-C (:mod:`paretorch.pipeline.search.interrupt`): an exception raised after SIGINT arrived is the interrupt,
never the trial's reason; the trial loop stops.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

import optuna
from optuna.distributions import CategoricalChoiceType

from paretorch.pipeline.core.stage import StageConfig, StageContext, config_from_dict
from paretorch.pipeline.engine.recipe import configs_to_json
from paretorch.pipeline.search.dashboard import note_infeasible, set_constraints
from paretorch.pipeline.search.duplicates import Repeats
from paretorch.pipeline.search.interrupt import Interrupts
from paretorch.pipeline.search.objectives import (
    ATTR_CONFIGS,
    ATTR_RUNTIME,
    ATTR_SEED,
    ATTR_SEED_PARAMS,
    ATTR_SEED_RECIPE,
    CONSTRAINT_NAME,
    Baseline,
)
from paretorch.pipeline.search.plan import StudyParts
from paretorch.pipeline.search.record import TrialOutcome, TrialRecord
from paretorch.pipeline.search.rule_out import study_choices
from paretorch.pipeline.search.screening import CostlyClock, Screening
from paretorch.pipeline.search.seeding import stage_params
from paretorch.pipeline.search.subset import SubsetJudge, subset_plan
from paretorch.pipeline.search.trial_steps import TRIAL_STEPS, Draft, Step, TrialState, TrialSteps, walk


class TrialObjective:
    """Runs the trials of one study against its measured baseline (see the module docstring); ``steps``: the trial's
    plan (:data:`~paretorch.pipeline.search.trial_steps.TRIAL_STEPS`)."""

    def __init__(self, parts: StudyParts, baseline: Baseline, interrupts: Interrupts | None = None,
                 steps: Sequence[Step[TrialSteps]] = TRIAL_STEPS) -> None:
        self.parts = parts
        self.baseline = baseline
        self.interrupts = interrupts or Interrupts()
        self.steps = tuple(steps)
        self.exports = [n.name for n in parts.pipeline.export_nodes()]
        #: The recipes the study measured (its proposals read the same index).
        self.repeats = Repeats(self.exports)
        self._choices: dict[str, tuple[CategoricalChoiceType, ...]] | None = None
        #: Costly stages at low fidelity first (paretorch.pipeline.search.screening), through the study's runner, within
        #: their share of this run's time (the clock starts now).
        clock = CostlyClock(parts.config.costly_share,
                            lambda: {name: tally.seconds for name, tally in parts.runner.stage_tallies.items()})
        plan = subset_plan(parts.spec)
        #: Scores a trial on a subset of the evaluation first (paretorch.pipeline.search.subset); None: always in full.
        subset = None if plan is None else SubsetJudge(
            parts.spec, parts.device, plan, lambda *inputs: parts.latency.baseline()(*inputs),
            parts.objectives.tail, parts.runner.reference)
        screening = Screening(parts.objectives, lambda configs, runtime: parts.runner.run(
            configs, runtime, exports=False).report, self.exports, clock=clock)
        #: What the steps share across the study's trials.
        self.shared = TrialSteps(parts, baseline, self.repeats, screening, subset)

    def __call__(self, trial: optuna.Trial) -> TrialOutcome:
        """Run one trial: its record and values, or ``KeyboardInterrupt`` if Ctrl-C arrived meanwhile."""
        start = time.perf_counter()
        with self.interrupts.watch():
            configs, runtime = self.choose(trial)
            self.announce(trial, configs, runtime)
            state = TrialState(trial, configs, runtime, self._draft(trial, configs, runtime), start)
            return self.record(trial, walk(self.steps, self.shared, state, self.interrupts))

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
        (:func:`paretorch.pipeline.search.storage.rerun_lines`)."""
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

    # ------------------------------------------------------------------ record

    def record(self, trial: optuna.Trial, outcome: TrialOutcome) -> TrialOutcome:
        """Write the record to the Optuna trial (user attrs; a complete trial's constraint and, when it is not
        feasible, its dashboard note) and index it for repeats."""
        record = outcome.record
        self.repeats.add(record)
        for key, value in record.user_attrs().items():
            trial.set_user_attr(key, value)
        if outcome.verdict is not None:
            set_constraints(trial, {CONSTRAINT_NAME: outcome.verdict.constraint})
            if (why := outcome.verdict.reason or outcome.verdict.unstable) is not None:
                note_infeasible(trial, why)
        return outcome
