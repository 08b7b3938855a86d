"""Cheap before costly: a trial with a costly stage (distillation, a calibrated quantization) runs first
at low fidelity, and pays the full cost only if it can still reach the front.

Each stage says what its low-fidelity config is (:meth:`paretorch.pipeline.core.stage.StageConfig.low_fidelity`:
a quarter of the distillation steps, one calibration batch); the screen runs the trial's chain with
those configs, eager (no compilation twice), and ends the trial there (pruned, with the reason) when

* its drop at low fidelity exceeds the allowed drop by more than the full fidelity can recover: the
  largest recovery measured so far on trials that screened the same stages (drop at low fidelity minus
  drop at full), times :attr:`ScreeningPolicy.safety`, or, before :attr:`ScreeningPolicy.min_history`
  such trials, :attr:`ScreeningPolicy.prior_margin` times the allowed drop; or
* (eager trials, whose screened latency is their own) a feasible trial is faster by more than
  :attr:`ScreeningPolicy.latency_tolerance` with a drop no worse than the trial could recover to.

* (any trial) the costly stages already took more than their share of this run's wall time
  (:class:`CostlyClock`, the search config's ``costly_share``): before the low-fidelity run (nothing costly is
  paid) or after it (the full cost is not paid). Distillation bought nothing on the MiniLM CPU search that
  took 2,341 s of its 6,338 s; the share keeps a search that finds nothing from it in minutes while a model
  whose front needs it (prune + distill) still gets a full costly trial every few cheap ones.

This is successive halving with two rungs, the promotion rule being "can still reach the front"
instead of "in the top 1/eta of its rung": Optuna's pruners (``SuccessiveHalvingPruner`` and the
others, through ``trial.report`` / ``trial.should_prune``) raise NotImplementedError in multi-objective
studies. A low-fidelity config is a different node of the runner's cache from its full config (other
fields, other key): the screened models never stand in for full ones. A trial whose full costly prefix
already ran in a complete trial is not screened (its prefix is cached, and it passed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.core.evaluate import ModelReport
from paretorch.pipeline.core.input_agreement import SCREEN_FACTOR
from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.stage import StageConfig
from paretorch.pipeline.engine.recipe import configs_to_json
from paretorch.pipeline.search.objectives import (
    ATTR_CONFIGS,
    ATTR_FEASIBLE,
    ATTR_METRICS,
    ATTR_RECIPE,
    TAIL_REASON,
    Baseline,
    Objectives,
)

#: Trial user attr: what the screen measured and decided (:meth:`Screened.attrs`).
ATTR_SCREEN = "paretorch.screen"
#: Trial user attr: why the screen ended the trial (only on screened-out trials).
ATTR_SCREENED_OUT = "paretorch.screened_out"
#: The runtime a screen runs under (no compilation paid twice).
SCREEN_RUNTIME = DEFAULT_RUNTIME
#: How a screened-out trial's reason starts.
SCREENED_OUT = "screened out at low fidelity"
#: The value of a node's config in a prefix of a trial's chain (:func:`_prefix`).
T = TypeVar("T")

RunFn = Callable[[Mapping[str, StageConfig | None], str], ModelReport]


@dataclass(frozen=True)
class LowFidelity:
    """A trial's configs with each costly stage at low fidelity, and which nodes were lowered."""

    configs: dict[str, StageConfig | None]
    lowered: tuple[str, ...]

    @property
    def key(self) -> str:
        """Which stages were lowered (the recovery history is kept per key)."""
        return ",".join(self.lowered)


def low_fidelity(configs: Mapping[str, StageConfig | None], export_nodes: Collection[str]) -> LowFidelity | None:
    """The low-fidelity form of a trial's configs (None: no model stage of it is costly)."""
    lowered: dict[str, StageConfig | None] = dict(configs)
    names: list[str] = []
    for node, config in configs.items():
        cheap = config.low_fidelity() if config is not None and node not in export_nodes else None
        if cheap is not None and cheap != config:
            lowered[node] = cheap
            names.append(node)
    return LowFidelity(lowered, tuple(names)) if names else None


def _prefix(configs: Mapping[str, T], last: str) -> list[tuple[str, T]]:
    items = list(configs.items())
    end = next(i for i, (node, _) in enumerate(items) if node == last)
    return items[: end + 1]


def ran_at_full(trials: Sequence[FrozenTrial], configs: Mapping[str, StageConfig | None], plan: LowFidelity) -> bool:
    """Whether a complete trial already ran the same configs up to the last costly node (full fidelity), as
    it asked for them or as they resolved (a runtime sweep replays a distillation cut short by its time
    budget as its resolved config: the steps it ran)."""
    wanted = _prefix(configs_to_json(configs), plan.lowered[-1])
    chain = [raw for _, raw in wanted if raw is not None]
    return any(t.state == TrialState.COMPLETE
               and (all(t.user_attrs.get(ATTR_CONFIGS, {}).get(node, "?") == raw for node, raw in wanted)
                    or t.user_attrs.get(ATTR_RECIPE, {}).get("stages", [])[: len(chain)] == chain)
               for t in trials)


def recoveries(trials: Sequence[FrozenTrial], key: str) -> list[float]:
    """Drop at low fidelity minus drop at full, of the complete trials whose screen lowered ``key`` and passed."""
    found = []
    for trial in trials:
        screen = trial.user_attrs.get(ATTR_SCREEN)
        full = trial.user_attrs.get(ATTR_METRICS, {}).get("metric_drop")
        if trial.state == TrialState.COMPLETE and screen and screen.get("lowered") == key and full is not None:
            found.append(float(screen["drop"]) - float(full))
    return found


def front_points(trials: Sequence[FrozenTrial], measured_key: str) -> list[tuple[float, float]]:
    """(drop, latency) of the complete trials within the allowed drop; the latency as the screen measures it
    (timed alone, not paired with the baseline: ``measured_key``, :attr:`Objectives.measured_key`; in a trial
    stored before the objective had its own name, ``<measured key>_unpaired`` where the trial has it)."""
    points = []
    for trial in trials:
        metrics = trial.user_attrs.get(ATTR_METRICS, {})
        latency = metrics.get(f"{measured_key}_unpaired", metrics.get(measured_key))
        if (trial.state == TrialState.COMPLETE and trial.user_attrs.get(ATTR_FEASIBLE)
                and "metric_drop" in metrics and latency is not None):
            points.append((float(metrics["metric_drop"]), float(latency)))
    return points


@dataclass(frozen=True)
class ScreeningPolicy:
    """When a low-fidelity measurement ends a trial (see the module docstring)."""

    #: Recovery assumed before any history, in multiples of the allowed drop.
    prior_margin: float = 3.0
    #: The largest recovery measured is multiplied by this.
    safety: float = 1.5
    #: Trials with a measured recovery (same lowered stages) before the history replaces the prior.
    min_history: int = 2
    #: A feasible trial must be this much faster (share of the latency) to dominate a screened one: wide,
    #: for latencies timed alone at different moments (on a busy host they move by tens of percent).
    latency_tolerance: float = 0.25

    def margin(self, allowed: float, history: Sequence[float]) -> float:
        """How much of its drop the full fidelity may still recover."""
        if len(history) < self.min_history:
            return self.prior_margin * allowed
        return max(0.0, max(history) * self.safety)

    def reason(self, drop: float, latency: float | None, allowed: float, margin: float,
               front: Sequence[tuple[float, float]]) -> str | None:
        """Why a trial measured at low fidelity cannot reach the front (None: it can)."""
        if drop - margin > allowed:
            return (f"drop {drop:.4f} > allowed {allowed:.4g} + the most the full fidelity recovers "
                    f"({margin:.4g})")
        best = drop - margin
        if latency is not None:
            faster = [(d, lat) for d, lat in front if lat < latency * (1 - self.latency_tolerance) and d <= best]
            if faster:
                d, lat = min(faster, key=lambda p: p[1])
                return (f"dominated: a feasible trial is faster ({lat:.3f} ms < {latency:.3f} ms) at drop {d:.4f}, "
                        f"no worse than the {best:.4f} this one could recover to")
        return None


#: How a reason given by the costly stages' time cap starts.
TIME_CAP = "time cap"
#: Costly work under this many seconds in a run is never capped: a small model's distillation costs seconds, and a
#: share of the first minute of a run would stop it before it could show anything.
COSTLY_FLOOR_S = 60.0

#: Stage name -> seconds it ran so far (the runner's stage tallies).
Tallies = Callable[[], Mapping[str, float]]


@dataclass
class CostlyClock:
    """The share of this run's wall time the costly stages took: the runner's tallies (low-fidelity and full
    runs, seconds since the clock started) of each stage the screen lowered so far, against ``share`` (and at
    least ``floor`` seconds: :data:`COSTLY_FLOOR_S`)."""

    share: float
    tallies: Tallies
    clock: Callable[[], float] = time.perf_counter
    floor: float = field(default_factory=lambda: COSTLY_FLOOR_S)
    started: float = field(init=False)
    at_start: dict[str, float] = field(init=False)
    stages: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.started = self.clock()
        self.at_start = dict(self.tallies())

    def spent(self) -> float:
        """Seconds the costly stages ran since the clock started."""
        now = self.tallies()
        return sum(now.get(name, 0.0) - self.at_start.get(name, 0.0) for name in self.stages)

    def over(self, stages: Collection[str]) -> str | None:
        """Why a trial lowering ``stages`` may not pay more costly work now (None: it may)."""
        self.stages.update(stages)
        spent, elapsed = self.spent(), self.clock() - self.started
        if spent <= max(self.share * elapsed, self.floor):
            return None
        return (f"{TIME_CAP}: costly stages ({', '.join(sorted(self.stages))}) took {spent:.0f} s of this run's "
                f"{elapsed:.0f} s, over the {self.share:.0%} cap (search config costly_share)")


@dataclass(frozen=True)
class Screened:
    """What the screen of one trial measured and decided."""

    lowered: str
    #: None: the time cap stopped the trial before the low-fidelity run.
    metric: float | None
    drop: float | None
    latency_ms: float | None
    margin: float
    seconds: float
    reason: str | None

    @property
    def passed(self) -> bool:
        return self.reason is None

    def attrs(self) -> dict[str, object]:
        """The trial's :data:`ATTR_SCREEN` user attr."""
        return {**asdict(self), "passed": self.passed}

    def out_reason(self) -> str:
        """The pruned trial's reason (:data:`SCREENED_OUT` ...)."""
        return f"{SCREENED_OUT} ({self.lowered}): {self.reason}"


class Screening:
    """The screen of one study: ``run(configs, runtime)`` measures a chain (the study's runner)."""

    def __init__(self, objectives: Objectives, run: RunFn, export_nodes: Collection[str],
                 policy: ScreeningPolicy | None = None, clock: CostlyClock | None = None) -> None:
        self.objectives = objectives
        self.run = run
        self.export_nodes = frozenset(export_nodes)
        self.policy = policy or ScreeningPolicy()
        #: The costly stages' share of the run's time (None: no cap).
        self.clock = clock

    def screen(self, trials: Sequence[FrozenTrial], configs: Mapping[str, StageConfig | None], runtime: str,
               baseline: Baseline) -> Screened | None:
        """Measure ``configs`` at low fidelity and decide (None: nothing costly, or its full prefix already ran)."""
        plan = low_fidelity(configs, self.export_nodes)
        if plan is None or ran_at_full(trials, configs, plan):
            return None
        stages = {config.stage for node in plan.lowered if (config := configs[node]) is not None}
        if self.clock is not None and (capped := self.clock.over(stages)) is not None:
            return Screened(plan.key, None, None, None, 0.0, 0.0, f"{capped}; not run")
        start = time.perf_counter()
        report = self.run(plan.configs, SCREEN_RUNTIME)
        seconds = time.perf_counter() - start
        allowed = self.objectives.threshold(baseline)
        drop = self.objectives.drop(baseline, report.metric_value)
        latency = report.latency_p50(self.objectives.latency_batch) if runtime == SCREEN_RUNTIME else None
        margin = self.policy.margin(allowed, recoveries(trials, plan.key))
        reason = self.policy.reason(drop, latency, allowed, margin, front_points(trials, self.objectives.measured_key))
        if reason is None and (tail := self.objectives.tail.failure(report.extra, SCREEN_FACTOR)) is not None:
            reason = f"{TAIL_REASON}{tail}"
        if reason is None and self.clock is not None and (capped := self.clock.over(stages)) is not None:
            reason = f"{capped}; the full cost is not paid"
        return Screened(plan.key, report.metric_value, drop, latency, margin, seconds, reason)


def record_screen(trial: optuna.Trial, screened: Screened | None) -> Screened | None:
    """Write what the screen found on ``trial`` (:data:`ATTR_SCREEN`, and :data:`ATTR_SCREENED_OUT` with
    the reason when it ended the trial); returns ``screened``."""
    if screened is not None:
        trial.set_user_attr(ATTR_SCREEN, screened.attrs())
        if screened.reason is not None:
            trial.set_user_attr(ATTR_SCREENED_OUT, screened.reason)
    return screened


def screened_note(trials: Sequence[FrozenTrial]) -> str | None:
    """The end-of-search line: how many trials the screen ended, and the trials it let through."""
    screens = [t.user_attrs[ATTR_SCREEN] for t in trials if ATTR_SCREEN in t.user_attrs]
    if not screens:
        return None
    out = sum(1 for s in screens if not s.get("passed"))
    capped = sum(1 for s in screens if str(s.get("reason") or "").startswith(TIME_CAP))
    seconds = sum(float(s.get("seconds", 0.0)) for s in screens)
    return (f"{out} of {len(screens)} screened trial(s) screened out at low fidelity before their full cost"
            + (f", {capped} of them by the costly stages' time cap" if capped else "")
            + f" (screens took {seconds:.1f} s; reasons: Optuna attr '{ATTR_SCREENED_OUT}')")
