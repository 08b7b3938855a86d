"""A trial as one declared sequence of steps: rule out, screen, probe, subset, evaluate, judge.

:data:`TRIAL_STEPS` is the trial's plan, declared once; :func:`walk` runs it. Each step takes the trial's frozen
:class:`TrialState` and returns the next state (what it learned added) or the trial's
:class:`~paretorch.pipeline.search.record.TrialOutcome`, which ends the walk:

* **rule out**: a configuration that need not run ends here, pruned with its reason (one that cannot change this
  model or that its runtime cannot run, :mod:`paretorch.pipeline.search.rule_out`, checked before any stage of the
  chain runs; a proposal that is a dead end by what was measured since, :mod:`paretorch.pipeline.search.dead_ends`; a
  repeat of a measured recipe or a config another worker runs, :mod:`paretorch.pipeline.search.duplicates`); a chain
  the device cannot run is an infeasible trial, ended before it runs;
* **screen**: costly stages at low fidelity first (:mod:`paretorch.pipeline.search.screening`);
* **probe**: the stages applied, the model timed paired with the baseline (:mod:`paretorch.pipeline.search.probe`):
  one far behind the front ends here, unscored;
* **subset**: a rowwise metric scored on a subset first (:mod:`paretorch.pipeline.search.subset`): a trial clearly
  over the allowed drop ends here;
* **evaluate**: the full evaluation (its latency is the probe's, not timed again);
* **judge**: :meth:`Objectives.verdict <paretorch.pipeline.search.objectives.Objectives.verdict>` on the metric, and
  the complete trial's record and values.

The steps that run the trial's model (screen, probe, subset, evaluate) are guarded: an infeasible config there is a
pruned outcome, any other exception a failed one, unless Ctrl-C came first (:mod:`paretorch.pipeline.search.interrupt`:
then it is raised, and after every step too). :class:`TrialSteps` holds what the steps share across one study's trials.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import optuna
from torch import Tensor

from paretorch.pipeline.core.device import describe
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.evaluate import Known
from paretorch.pipeline.core.stage import StageConfig
from paretorch.pipeline.engine.recipe import configs_to_json
from paretorch.pipeline.engine.run_result import RunResult
from paretorch.pipeline.search.dead_ends import RuntimeGains
from paretorch.pipeline.search.duplicates import Repeats, model_configs
from paretorch.pipeline.search.interrupt import Interrupts
from paretorch.pipeline.search.objectives import ATTR_ESTIMATE, Baseline
from paretorch.pipeline.search.plan import StudyParts
from paretorch.pipeline.search.probe import behind_front, front_references
from paretorch.pipeline.search.record import (
    COMPLETE,
    FAIL,
    FULL_FIDELITY,
    PROBE_FIDELITY,
    PRUNED,
    TrialOutcome,
    TrialRecord,
    budget_metrics,
    sensitivity_tables,
)
from paretorch.pipeline.search.recorded import RECORDED, recorded
from paretorch.pipeline.search.screening import Screened, Screening, record_screen
from paretorch.pipeline.search.study_latency import BASELINE_RUNTIME, TrialTiming
from paretorch.pipeline.search.subset import SubsetJudge
from paretorch.pipeline.search.workers import claim_config

#: A record of this trial with its outcome fields still to fill (state, metrics or reason).
Draft = Callable[..., TrialRecord]


@dataclass(frozen=True)
class Probed:
    """What the probe step measured: the trial's model prepared for its runtime, the run of its stages (no
    evaluation), its paired timing, and the run's seconds so far (stages, screening, paired latency, trial)."""

    fn: Callable[..., Tensor]
    staged: RunResult
    timing: TrialTiming
    seconds: dict[str, float]


@dataclass(frozen=True)
class TrialState:
    """What one trial knows so far, handed from step to step (each adds what it learned to a new state)."""

    trial: optuna.Trial
    configs: dict[str, StageConfig | None]
    runtime: str
    draft: Draft
    #: ``time.perf_counter()`` when the trial started.
    start: float
    #: The low-fidelity screen of the costly stages (None: not screened).
    screened: Screened | None = None
    probed: Probed | None = None
    #: The full evaluation.
    result: RunResult | None = None

    def elapsed(self) -> float:
        """The trial's seconds so far."""
        return time.perf_counter() - self.start

    def pruned(self, **fields: Any) -> TrialOutcome:
        """The trial ends here, pruned (ruled out, a repeat, or decided before it was scored in full)."""
        return TrialOutcome(self.draft(state=PRUNED, **fields))

    def measured(self) -> Probed:
        """What the probe step measured (a step after it reads it)."""
        if self.probed is None:
            raise RuntimeError("the trial has no probe yet: the probe step runs before this one")
        return self.probed

    def screen_seconds(self) -> dict[str, float]:
        return {"screening": self.screened.seconds} if self.screened else {}


K = TypeVar("K")


@dataclass(frozen=True)
class Step(Generic[K]):
    """One step of a trial's plan: its name, what it does (on what the steps share, ``K``, and the trial's state), and
    whether it runs the trial's model (its exceptions are then the trial's outcome, not the search's)."""

    name: str
    run: Callable[[K, TrialState], TrialState | TrialOutcome]
    runs_model: bool = False

    def __call__(self, shared: K, state: TrialState, interrupts: Interrupts) -> TrialState | TrialOutcome:
        if not self.runs_model:
            return self.run(shared, state)
        try:
            return self.run(shared, state)
        except InfeasibleConfig as exc:
            interrupts.check(exc)
            return state.pruned(infeasible=exc.reason)
        except Exception as exc:
            interrupts.check(exc)
            return TrialOutcome(state.draft(state=FAIL, error=traceback.format_exc()), failure=exc)


def walk(steps: Sequence[Step[K]], shared: K, state: TrialState, interrupts: Interrupts) -> TrialOutcome:
    """Run ``steps`` in order from ``state`` until one returns the trial's outcome (Ctrl-C checked after each)."""
    for step in steps:
        after = step(shared, state, interrupts)
        interrupts.check()  # a tracer may have swallowed the interrupt and finished the step
        if isinstance(after, TrialOutcome):
            return after
        state = after
    raise RuntimeError(f"the trial's steps ({', '.join(s.name for s in steps)}) ended without an outcome")


class TrialSteps:
    """The steps of one study's trials, against its measured baseline, and what they share across its trials: the
    study's parts, the index of measured recipes, the screen and the subset judge (None: always scored in full)."""

    def __init__(self, parts: StudyParts, baseline: Baseline, repeats: Repeats, screening: Screening,
                 subset: SubsetJudge | None) -> None:
        self.parts = parts
        self.baseline = baseline
        self.repeats = repeats
        self.screening = screening
        self.subset_judge = subset
        self.exports = [n.name for n in parts.pipeline.export_nodes()]

    def gains(self, study: optuna.Study) -> RuntimeGains:
        """What the study's measured trials say about each runtime (:mod:`paretorch.pipeline.search.dead_ends`)."""
        return RuntimeGains.of(study, lambda record: bool(record.feasible))

    def rule_out(self, state: TrialState) -> TrialState | TrialOutcome:
        """A pruned outcome with its reason for a configuration that need not run, else the state (run it)."""
        trial, runtime, rules, runtimes = state.trial, state.runtime, self.parts.rules, self.parts.runtimes
        chain = model_configs(state.configs, self.exports)
        if runtime not in runtimes:
            return state.pruned(ruled_out=f"runtime {runtime} is not available here (the study offered it before; "
                                          f"now: {', '.join(runtimes)})")
        if (reason := rules.reason(chain) or rules.runtime_reason(chain, runtime)) is not None:
            return state.pruned(ruled_out=reason)
        estimate = trial.user_attrs.get(ATTR_ESTIMATE)  # a proposal: the trials since may make it a dead end
        if estimate and (reason := self.gains(trial.study).dead_end_reason(estimate, runtime)) is not None:
            return state.pruned(ruled_out=reason)
        original = self.repeats.original(trial.study, chain, runtime)
        if original is None:  # another worker runs (or ran) the same config: do not run it twice
            original = claim_config(trial, configs_to_json(state.configs), runtime)
        if original is not None:
            return state.pruned(repeat_of=original)
        if (reason := rules.unavailable(chain)) is not None:
            return state.pruned(infeasible=reason)  # a trial, ended before its chain runs
        return state

    def screen(self, state: TrialState) -> TrialState | TrialOutcome:
        """The low-fidelity screen of the trial's costly stages, recorded on the trial; a screen that fails ends the
        trial before its full cost."""
        if not self.parts.config.screening:
            return state
        trials = state.trial.study.get_trials(deepcopy=False)
        screened = record_screen(state.trial, self.screening.screen(trials, state.configs, state.runtime,
                                                                    self.baseline))
        if screened is not None and not screened.passed:
            return state.pruned(infeasible=screened.out_reason(),
                                seconds={"screening": screened.seconds, "trial": state.elapsed()})
        return replace(state, screened=screened)

    def probe(self, state: TrialState) -> TrialState | TrialOutcome:
        """Apply the stages and time the model paired with the baseline, stopping against the front; a trial far
        behind the front ends here, not scored (its resolved recipe kept, so its params say what ran). A runtime
        alone on the unoptimized model decides against the front's best-scoring trial alone."""
        parts, trial, runtime = self.parts, state.trial, state.runtime
        fn, staged = parts.runner.prepared_run(state.configs, runtime)
        paired_start = time.perf_counter()
        front = front_references(trial.study)
        unchanged = all(config is None for config in model_configs(state.configs, self.exports))
        timing = parts.latency.probe(fn, runtime, front.stop_rule(unchanged),
                                     itself=unchanged and runtime == BASELINE_RUNTIME)
        seconds = {**staged.seconds, **state.screen_seconds(), "paired_latency": time.perf_counter() - paired_start}
        seconds["trial"] = state.elapsed()
        behind = behind_front(timing.paired, front, runtime, self.gains(trial.study).plain.get(runtime),
                              unchanged=unchanged)
        if behind is not None:
            recipe = staged.recipe(parts.spec.name, deferred_exports={n: state.configs.get(n) for n in self.exports},
                                   metadata={"study": parts.study_name, "trial": trial.number})
            return state.pruned(infeasible=behind, metrics=timing.paired.metrics(), seconds=seconds,
                                fidelity=PROBE_FIDELITY, recipe=recipe,
                                cache={"hits": staged.cache_hits, "misses": staged.cache_misses})
        return replace(state, probed=Probed(fn, staged, timing, seconds))

    def subset(self, state: TrialState) -> TrialState | TrialOutcome:
        """Score a rowwise metric on a subset of the evaluation first: a trial clearly over the allowed drop there
        ends here, not scored in full."""
        if self.subset_judge is None:
            return state
        probed, objectives = state.measured(), self.parts.objectives
        judged = self.subset_judge.judge(probed.fn, state.runtime, objectives.latency_batch,
                                         objectives.threshold(self.baseline))
        if judged.over is None:
            return state
        return state.pruned(infeasible=judged.over, seconds=probed.seconds, fidelity=judged.fidelity,
                            metrics={**probed.timing.paired.metrics(), "metric_drop_subset": judged.drop})

    def evaluate(self, state: TrialState) -> TrialState:
        """Evaluate the final model in full; its latency is the probe's. On a workload the probe timed raw inputs to
        host outputs: the model call is timed alone in the evaluation, the figure beside it
        (:mod:`paretorch.pipeline.core.workload`)."""
        parts, probed = self.parts, state.measured()
        known = {parts.objectives.latency_batch: probed.timing.stats} if parts.latency.workload is None else {}
        result = parts.runner.run(state.configs, state.runtime, exports=parts.config.exports == "every_trial",
                                  known=Known(probed.fn, known))
        return replace(state, result=result)

    def judge(self, state: TrialState) -> TrialOutcome:
        """The verdict on the evaluated trial, and its complete record and objective values."""
        parts, probed, result = self.parts, state.measured(), state.result
        if result is None:
            raise RuntimeError("the trial has no evaluation: the evaluate step runs before the judge")
        report, paired, staged = result.report, probed.timing.paired, probed.staged
        objectives = parts.objectives
        verdict = objectives.verdict(self.baseline, report.metric_value, paired.unstable, report.extra,
                                     report.metric_resamples)
        metrics = objectives.trial_metrics(report, self.baseline, paired)
        measured = recorded(report, metrics, objectives.latency_batch, describe(parts.device))
        recipe = result.recipe(parts.spec.name, deferred_exports={n: state.configs.get(n) for n in self.exports},
                               metadata={"study": parts.study_name, "trial": state.trial.number, RECORDED: measured})
        run_seconds = {k: v + staged.seconds.get(k, 0.0) for k, v in result.seconds.items()}
        record = state.draft(
            state=COMPLETE, recipe=recipe, metrics={**metrics, **budget_metrics(recipe.stages, verdict.headroom)},
            seconds={**run_seconds, **state.screen_seconds(), "paired_latency": probed.seconds["paired_latency"],
                     "trial": state.elapsed()},
            cache={"hits": result.cache_hits + staged.cache_hits, "misses": result.cache_misses + staged.cache_misses},
            feasible=verdict.feasible, over_drop=verdict.reason, latency_unstable=verdict.unstable,
            uncertain=verdict.uncertain, tables=sensitivity_tables(result.nodes), fidelity=FULL_FIDELITY,
            worst_inputs=report.worst_inputs,
        )
        return TrialOutcome(record, values=objectives.values(report, metrics[objectives.latency_key]), verdict=verdict)


#: A trial's plan: its steps in order, each returning the next state or the trial's outcome (see the module docstring).
TRIAL_STEPS: tuple[Step[TrialSteps], ...] = (
    Step("rule out", TrialSteps.rule_out),
    Step("screen", TrialSteps.screen, runs_model=True),
    Step("probe", TrialSteps.probe, runs_model=True),
    Step("subset", TrialSteps.subset, runs_model=True),
    Step("evaluate", TrialSteps.evaluate, runs_model=True),
    Step("judge", TrialSteps.judge),
)
