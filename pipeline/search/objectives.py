"""What the search optimizes: objective values, the metric-drop constraint and per-trial metrics.

Defaults: maximize the spec's metric (minimize it when lower is better) and
minimize latency p50 at the spec's first latency batch size; optionally
minimize the serialized size. The allowed metric drop against the unoptimized
baseline (``--max-drop``: absolute, or a percentage of the baseline metric, see
:mod:`paretorch.pipeline.search.allowed_drop`) is a constraint (``drop - allowed <= 0`` is
feasible), stored on the trial with ``trial.set_constraint`` (Optuna 5's replacement
of the deprecated sampler ``constraints_func``), which every sampler and
``study.best_trials`` read. :meth:`Objectives.verdict` is the one place a drop is judged.

A trial's drop reads on the console with its 95 % bootstrap interval (:func:`drop_text`, the interval stored in its
metrics: :func:`stored_interval`; :mod:`paretorch.pipeline.core.bootstrap`), and the end of a search counts the trials
whose interval straddles the allowed drop (:data:`UNCERTAIN`: their verdict is within sampling noise,
:func:`uncertain_note`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Literal

from paretorch.pipeline.core.bootstrap import drop_interval
from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.evaluate import ModelReport
from paretorch.pipeline.core.fidelity_floor import floor_failures
from paretorch.pipeline.core.input_agreement import HEADLINE_INPUT_METRICS, TailGuard
from paretorch.pipeline.core.paired import PairedLatency
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.search.allowed_drop import FLAG, AllowedDrop
from paretorch.pipeline.search.schema import OBJECTIVE_NAMES, ObjectiveName

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

CONSTRAINT_NAME = "metric_drop"

# What each trial stores in Optuna (user attrs), so that reports and replays need only the storage.
ATTR_CONFIGS = "paretorch.configs"  # {node: config dict | None}: what the trial asked for
ATTR_RUNTIME = "paretorch.runtime"
ATTR_SEED = "paretorch.seed"  # name of an enqueued seed (baseline, amp-only ...), set at enqueue time
#: The seed name of a study's unoptimized trial (enqueued first).
BASELINE_SEED = "baseline"
ATTR_SEED_RECIPE = "paretorch.seed_recipe"  # the seed's stage configs, set at enqueue time
ATTR_SEED_PARAMS = "paretorch.seed_params"  # the Optuna params enqueued with the seed (see search/seeding.py)
ATTR_RECIPE = "paretorch.recipe"  # the resolved recipe (JSON-ready dict)
ATTR_RECIPE_LINE = "paretorch.recipe_line"
ATTR_METRICS = "paretorch.metrics"
ATTR_SECONDS = "paretorch.seconds"
ATTR_CACHE = "paretorch.cache"
ATTR_INFEASIBLE = "paretorch.infeasible"
ATTR_TRACEBACK = "paretorch.traceback"
#: How much of a failed trial's traceback its user attribute keeps (the end).
TRACEBACK_CHARS = 20_000
ATTR_FEASIBLE = "paretorch.feasible"  # complete and within the allowed drop (False otherwise)
ATTR_REASON = "paretorch.reason"  # why a trial is not a feasible result: infeasible, over the drop, failed, repeat
ATTR_REPEAT_OF = "paretorch.repeat_of"  # the earlier trial that measured the same recipe (a pruned repeat)
#: Trial user attr: what an enqueued proposal's estimate started from (``SeedRecipe.estimate``).
ATTR_ESTIMATE = "paretorch.estimate"
ATTR_LATENCY_UNSTABLE = "paretorch.latency_unstable"  # why a complete trial's paired latency is not trusted
ATTR_UNCERTAIN = "paretorch.uncertain"  # the drop's bootstrap interval straddles the allowed drop
# Study user attrs.
ATTR_BASELINE = "paretorch.baseline"
ATTR_EXPORTS = "paretorch.exports"  # + ".<trial number>": {export node: "ok" | reason}
ATTR_SEARCH = "paretorch.search"  # the search config (JSON) that named the study
ATTR_DOMINATED_BY = "paretorch.dominated_by"  # {trial: front trial that dominates it}, written when the study ends
ATTR_REMEASURED = "paretorch.remeasured"  # {trial: re-measured speed-up}, the front timed again when the study ends
#: The Optuna constraint of a trial whose latency is unstable (any positive value keeps it off ``best_trials``).
UNSTABLE_CONSTRAINT = 1.0
#: How a trial's reason starts when its metric is within the drop but a fidelity floor is not met.
FLOOR_REASON = "below the fidelity floor: "
#: The tail guard of a study that sets none (the defaults of :class:`TailGuard`).
DEFAULT_TAIL_GUARD = TailGuard()
#: How the reason of a trial within the drop whose inputs broke past the tail guard's limit starts.
TAIL_REASON = "tail: "
#: The word a trial line and the table carry when the drop's interval straddles the allowed drop.
UNCERTAIN = "uncertain"


@dataclass(frozen=True)
class Baseline:
    """The unoptimized model's numbers every trial is compared with."""

    metric_value: float
    latency_ms: float
    size_bytes: float
    trial: int | None = None
    #: The metric on the fixed bootstrap resamples (:mod:`paretorch.pipeline.core.bootstrap`), each trial's paired with
    #: them.
    metric_resamples: tuple[float, ...] = ()
    #: The model call alone at the objective batch (``latency_ms`` is the workload's; None: the two are one, the
    #: objective is the model call, ``--workload model``, or the baseline was stored before workloads).
    model_call_ms: float | None = None

    def __post_init__(self) -> None:  # read back from JSON (the study attr) as a list
        object.__setattr__(self, "metric_resamples", tuple(self.metric_resamples))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Baseline:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class DropVerdict:
    """A trial's metric against the allowed drop."""

    feasible: bool
    #: The Optuna constraint, feasible when <= 0: ``drop - allowed``, pushed above 0 when the latency is unstable.
    constraint: float
    #: Why it is not feasible (``drop 0.0300 > allowed 0.0098 (1% of the baseline 0.9822)``); None when feasible.
    reason: str | None
    #: ``latency unstable: ...``: the metric may be within the drop, but the latency is not trusted.
    unstable: str | None = None
    #: ``allowed - drop``: how much more the metric may drop (negative: over the allowed drop).
    headroom: float = 0.0
    #: The drop's 95 % bootstrap interval straddles the allowed drop: the verdict is within sampling noise.
    uncertain: bool = False


@dataclass(frozen=True)
class Objectives:
    """The objective list of one study and how to read it off a :class:`ModelReport`."""

    spec: ModelSpec
    names: tuple[ObjectiveName, ...]
    latency_batch: int
    allowed_drop: AllowedDrop
    #: How many inputs may break against the unoptimized model (:mod:`paretorch.pipeline.core.input_agreement`).
    tail: TailGuard = DEFAULT_TAIL_GUARD

    @classmethod
    def create(cls, spec: ModelSpec, names: Sequence[str], max_drop: AllowedDrop | str | float,
               latency_batch: int | None = None, tail: TailGuard = DEFAULT_TAIL_GUARD) -> Objectives:
        unknown = [n for n in names if n not in OBJECTIVE_NAMES]
        if unknown or not names or len(set(names)) != len(names):
            raise ConfigError(f"objectives must be distinct names from {', '.join(OBJECTIVE_NAMES)}; got {list(names)}")
        if "metric" not in names:
            raise ConfigError("the objectives must include 'metric' (the task metric is what the drop is measured on)")
        allowed = AllowedDrop.parse(max_drop)
        bounds = spec.metric.bounds
        if allowed.kind == "absolute" and bounds is not None and allowed.amount > bounds[1] - bounds[0]:
            low, high = bounds
            raise ConfigError(f"{FLAG} {allowed.given()}: {spec.metric.name} lies in [{low:g}, {high:g}], so a drop "
                              f"above {high - low:g} means nothing; give an absolute drop such as 0.01 (one point) "
                              f"or a relative one such as 1%")
        batch = latency_batch if latency_batch is not None else spec.latency_batch_sizes[0]
        return cls(spec=spec, names=tuple(names), latency_batch=batch,  # type: ignore[arg-type]
                   allowed_drop=allowed, tail=tail)

    @property
    def latency_key(self) -> str:
        """The latency objective: the baseline's p50 divided by the trial's speed-up (paired), every trial on
        the baseline's one scale; derived, not measured (the trial's own p50, timed alone, is
        :attr:`measured_key`)."""
        return f"latency_ms_b{self.latency_batch}_via_speedup"

    @property
    def measured_key(self) -> str:
        """The trial's own p50 at the objective batch, timed alone (:meth:`ModelReport.as_metrics`)."""
        return f"latency_ms_p50_b{self.latency_batch}"

    def objective_latency(self, metrics: Mapping[str, float]) -> tuple[float, tuple[float, float]]:
        """A trial's latency objective and its 95% interval from its stored metrics (NaN where missing). A trial
        stored before the objective had a name of its own kept it under :attr:`measured_key`."""
        key = self.latency_key if self.latency_key in metrics else self.measured_key
        return (float(metrics.get(key, math.nan)),
                (float(metrics.get(f"{key}_ci_low", math.nan)), float(metrics.get(f"{key}_ci_high", math.nan))))

    def directions(self) -> list[Literal["minimize", "maximize"]]:
        return [self._direction(n) for n in self.names]

    def _direction(self, name: ObjectiveName) -> Literal["minimize", "maximize"]:
        if name == "metric":
            return "maximize" if self.spec.metric.higher_is_better else "minimize"
        return "minimize"

    def metric_names(self) -> list[str]:
        """Names of the objective values, in order (stored on the study, logged to MLflow)."""
        keys = {"metric": self.spec.metric.name, "latency": self.latency_key, "size": "size_bytes"}
        return [keys[n] for n in self.names]

    def headline_keys(self) -> tuple[str, ...]:
        """The metrics a user reads first: the task metric, its drop, the objective latency,
        the speed-up and the size (MLflow logs the others under ``detail.``)."""
        return (self.spec.metric.name, "metric_drop", "metric_drop_ci_low", "metric_drop_ci_high",
                "metric_drop_relative", *HEADLINE_INPUT_METRICS, self.latency_key, "speedup", "model_call_speedup",
                "size_bytes")

    def values(self, report: ModelReport, latency_ms: float | None = None) -> tuple[float, ...]:
        """The objective values; ``latency_ms``: the latency objective (the paired one, see :meth:`trial_metrics`)."""
        by_name = {
            "metric": report.metric_value,
            "latency": report.latency_p50(self.latency_batch) if latency_ms is None else latency_ms,
            "size": float(report.size_bytes),
        }
        return tuple(by_name[n] for n in self.names)

    def baseline_from(self, report: ModelReport, trial: int | None = None,
                      workload_ms: float | None = None) -> Baseline:
        """The baseline of ``report``; ``workload_ms``: its latency on the study's workload (None: the model call's,
        ``--workload model``), the scale every trial's objective latency is on."""
        model_call_ms = report.latency_p50(self.latency_batch)
        if workload_ms is None:  # the objective is the model call: one figure
            return Baseline(report.metric_value, model_call_ms, float(report.size_bytes), trial,
                            report.metric_resamples)
        return Baseline(report.metric_value, workload_ms, float(report.size_bytes), trial, report.metric_resamples,
                        model_call_ms=model_call_ms)

    def drop(self, baseline: Baseline, metric_value: float) -> float:
        """How much worse than the baseline (absolute; positive = worse)."""
        return self.spec.metric.drop(baseline.metric_value, metric_value)

    def drop_interval(self, baseline: Baseline, resamples: Sequence[float]) -> tuple[float, float] | None:
        """The 95 % paired bootstrap interval of a trial's drop from its metric ``resamples`` (None: no interval)."""
        return drop_interval(baseline.metric_resamples, resamples, self.spec.metric.higher_is_better)

    def uncertain(self, baseline: Baseline, resamples: Sequence[float]) -> bool:
        """Whether the drop's interval straddles the allowed drop: within noise of the line, either verdict."""
        interval = self.drop_interval(baseline, resamples)
        return interval is not None and interval[0] <= self.threshold(baseline) <= interval[1]

    def threshold(self, baseline: Baseline) -> float:
        """The absolute drop allowed against ``baseline`` (a :class:`ConfigError` when a relative drop
        meets a baseline metric <= 0)."""
        return self.allowed_drop.threshold(baseline.metric_value)

    def limit(self, baseline: Baseline) -> float:
        """The worst metric value within the allowed drop (the line on the Pareto plot)."""
        sign = -1.0 if self.spec.metric.higher_is_better else 1.0
        return baseline.metric_value + sign * self.threshold(baseline)

    def verdict(self, baseline: Baseline, metric_value: float, unstable: str | None = None,
                extras: Mapping[str, float] | None = None, resamples: Sequence[float] = ()) -> DropVerdict:
        """:meth:`judge`, marked ``uncertain`` when the drop's bootstrap interval (from ``resamples``, the trial's
        metric on the fixed resamples) straddles the allowed drop."""
        judged = self.judge(baseline, metric_value, unstable, extras)
        return replace(judged, uncertain=self.uncertain(baseline, resamples))

    def judge(self, baseline: Baseline, metric_value: float, unstable: str | None = None,
              extras: Mapping[str, float] | None = None) -> DropVerdict:
        """Whether ``metric_value`` is within the allowed drop: the one comparison every feasibility
        check uses (the trial's tag, the Optuna constraint, the runtime sweep). ``unstable``: why the
        trial's paired latency is not trusted (:mod:`paretorch.pipeline.core.paired`). ``extras``: the trial's
        extra metrics, checked against the spec's fidelity floors (:mod:`paretorch.pipeline.core.fidelity_floor`) at
        this drop's share of the baseline metric (a stricter drop, a higher floor) and against the tail guard (the
        share of inputs that broke, :mod:`paretorch.pipeline.core.input_agreement`); a trial that fails one is
        infeasible with the floor or the tail as its reason, its constraint positive. A trial within the drop whose
        latency is unstable is *feasible* (its metric is fine; the verdict's ``unstable`` says why it is kept off the
        front) while its Optuna constraint is positive, so ``study.best_trials`` leaves it out."""
        drop = self.drop(baseline, metric_value)
        allowed = self.threshold(baseline)
        constraint = drop - allowed
        share = allowed / abs(baseline.metric_value) if baseline.metric_value else None
        floors = floor_failures(self.spec, extras or {}, share) if self.spec.fidelity_floors else []
        guards = [FLOOR_REASON + "; ".join(floors)] if floors else []
        if (tail := self.tail.failure(extras or {})) is not None:
            guards.append(TAIL_REASON + tail)
        if guards and constraint <= 0:
            return DropVerdict(False, max(constraint, 0.0) + UNSTABLE_CONSTRAINT, "; ".join(guards),
                               unstable and f"latency unstable: {unstable}", -constraint)
        if constraint <= 0 and unstable is None:
            return DropVerdict(True, constraint, None, headroom=-constraint)
        unstable = f"latency unstable: {unstable}" if unstable is not None else None
        if constraint <= 0:  # feasible; its timing keeps it off the front (its Optuna constraint says so, not its tag)
            return DropVerdict(True, max(constraint, 0.0) + UNSTABLE_CONSTRAINT, None, unstable, -constraint)
        detail = "" if self.allowed_drop.kind == "absolute" else (
            f" ({self.allowed_drop.given()} of the baseline {baseline.metric_value:.4g})")
        return DropVerdict(False, constraint, f"drop {drop:.4f} > allowed {allowed:.4g}{detail}", unstable,
                           -constraint)

    def describe_drop(self, baseline: Baseline | None = None) -> str:
        """The allowed drop in words: ``0.01 absolute``, ``1% of the baseline 0.9822 = 0.009822 absolute``."""
        return self.allowed_drop.describe(baseline.metric_value if baseline is not None else None)

    def drop_params(self, baseline: Baseline) -> dict[str, str | float]:
        """The study's parent-run params: the allowed drop as given, its kind and the absolute threshold."""
        return {"max_drop": self.allowed_drop.given(), "max_drop_kind": self.allowed_drop.kind,
                "max_drop_absolute": self.threshold(baseline)}

    def trial_metrics(self, report: ModelReport, baseline: Baseline,
                      paired: PairedLatency | None = None) -> dict[str, float]:
        """Everything logged for one trial: the report's measurements plus drop and ratios.

        ``speedup``: with ``paired`` (the trial timed alternating with the baseline), its paired speed-up,
        else the baseline's p50 over the trial's. The objective latency (:attr:`latency_key`) is the study
        baseline's p50 over that speed-up (every trial on the baseline's one scale; its 95% interval likewise);
        the trial's own p50, timed alone, stays under :attr:`measured_key` with its own interval."""
        metrics = report.as_metrics()
        latency = report.latency_p50(self.latency_batch)
        metrics["metric_drop"] = self.drop(baseline, report.metric_value)
        if interval := self.drop_interval(baseline, report.metric_resamples):
            metrics["metric_drop_ci_low"], metrics["metric_drop_ci_high"] = interval
        if baseline.metric_value > 0:
            metrics["metric_drop_relative"] = metrics["metric_drop"] / baseline.metric_value
        model_call_ms = baseline.model_call_ms if baseline.model_call_ms is not None else baseline.latency_ms
        metrics["speedup"] = model_call_ms / latency if latency > 0 else 0.0
        if baseline.model_call_ms is not None and latency > 0:  # the model call alone, beside the workload's figure
            metrics["model_call_speedup"] = metrics["speedup"]
        key = self.latency_key
        metrics[key] = latency
        if paired is not None and paired.speedup > 0:
            metrics.update(paired.metrics())
            metrics[key] = baseline.latency_ms / paired.speedup
            low, high = paired.ci
            metrics[f"{key}_ci_low"] = baseline.latency_ms / high if high > 0 else 0.0
            metrics[f"{key}_ci_high"] = baseline.latency_ms / low if low > 0 else metrics[key]
        metrics["size_ratio"] = report.size_bytes / baseline.size_bytes if baseline.size_bytes else 0.0
        return metrics


def drop_text(drop: float, interval: tuple[float, float] = (math.nan, math.nan)) -> str:
    """``+0.0120 [+0.0050, +0.0190]``: the drop and its 95 % interval (the drop alone where none was computed)."""
    low, high = interval
    text = f"{drop:+.4f}"
    if math.isfinite(low) and math.isfinite(high):
        text += f" [{low:+.4f}, {high:+.4f}]"
    return text


def stored_interval(metrics: Mapping[str, float]) -> tuple[float, float]:
    """The drop's interval from a trial's stored metrics (NaN where the study measured none)."""
    return (float(metrics.get("metric_drop_ci_low", math.nan)), float(metrics.get("metric_drop_ci_high", math.nan)))


def uncertain_note(trials: Sequence[FrozenTrial]) -> str | None:
    """``3 trial(s) uncertain: ...``: how many trials have a drop interval straddling the allowed drop (None: none)."""
    numbers = [t.number for t in trials if t.user_attrs.get(ATTR_UNCERTAIN)]
    if not numbers:
        return None
    listed = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
    return (f"{len(numbers)} trial(s) {UNCERTAIN}: the 95 % interval of their metric drop straddles the allowed "
            f"drop, so feasible or not is within sampling noise of the evaluation data (trials {listed})")
