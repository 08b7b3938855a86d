"""Compose before exploring: the combinations of measured single techniques, under the runtimes that won.

A *component* is what one technique adds to a recipe: one numeric stage (quantize, amp) or a run of
consecutive structural stages (prune, or prune then distill: a distillation belongs to the structure it
recovers). A trial whose recipe is one component (after a runtime, alone) measured that technique;
its *gain* is its speed-up over the plain model under the same runtime (where that was measured,
else its speed-up). The winners of each axis (the nodes a component occupies) are its components with
the highest gain, above :data:`MIN_GAIN`, each from a trial within the allowed drop. A composition takes
two or more winners of different axes, in pipeline order, under one of the runtimes whose best feasible
trials are the fastest: the cross product, best estimated first (gains multiplied, but of the precision
stages' only the largest: :attr:`paretorch.pipeline.core.stage.Stage.precision`; fewer components first among equals;
compositions whose components' drops add up to more than the allowed drop come last), never a recipe already
measured, nor one a stage rules out after the stages before it
(:meth:`paretorch.pipeline.core.stage.Stage.cannot_follow`).

Pure functions over :class:`Measured` trials; the study enqueues what :func:`compositions` returns
(bounded by the search config's ``compose`` cap) when its queue of enqueued trials is empty, so the
sampler explores only after the combinations of what works were tried.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import prod

from optuna.trial import FrozenTrial

from paretorch.pipeline.core.stage import StageConfig, stage_for
from paretorch.pipeline.search.objectives import ATTR_SEED
from paretorch.pipeline.search.record import TrialRecord

#: Seed names of composed trials start with this.
COMPOSED_PREFIX = "composed-from-trials-"
#: A component must make the model at least this much faster (speed-up ratio over the plain model under the
#: same runtime) to be a winner: a few percent is within what two trials' timings move by on a busy host.
MIN_GAIN = 1.05

NodeConfig = tuple[str, StageConfig]


@dataclass(frozen=True)
class Measured:
    """A complete trial within the allowed drop, as composition reads it."""

    number: int
    runtime: str
    #: (stage node, requested config) of the stages that ran, in pipeline order.
    requested: tuple[NodeConfig, ...]
    #: The resolved recipe's model stages, in the same order.
    resolved: tuple[StageConfig, ...]
    speedup: float
    drop: float


@dataclass(frozen=True)
class Component:
    """What one technique adds: a numeric stage, or a run of consecutive structural stages."""

    stages: tuple[NodeConfig, ...]
    #: A precision stage (quantize, amp: ``Stage.precision``): it speeds up the same matrix work as another one.
    precision: bool = False

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(node for node, _ in self.stages)

    @property
    def key(self) -> str:
        return _key(config for _, config in self.stages)

    def describe(self) -> str:
        return " + ".join(config.describe() for _, config in self.stages)


@dataclass(frozen=True)
class Winner:
    """A component with its gain, the measured drop of its best trial and that trial's number."""

    component: Component
    gain: float
    drop: float
    number: int


@dataclass(frozen=True)
class Composition:
    """A recipe to enqueue: two or more winners under one runtime."""

    winners: tuple[Winner, ...]
    runtime: str

    @property
    def stages(self) -> tuple[NodeConfig, ...]:
        return tuple(stage for w in self.winners for stage in w.component.stages)

    @property
    def configs(self) -> tuple[StageConfig, ...]:
        return tuple(config for _, config in self.stages)

    @property
    def estimated_gain(self) -> float:
        """Gains multiply, except those of precision stages with each other (int8 and bf16 speed up the same
        matrix products: on an H200 at batch 256, prune depth + pack + int8 dynamic + bf16 ran at 2.6x where
        pack + fp16 ran at 7.4x): of those only the largest counts."""
        others = prod(w.gain for w in self.winners if not w.component.precision)
        return others * max((w.gain for w in self.winners if w.component.precision), default=1.0)

    @property
    def estimated_drop(self) -> float:
        return sum(max(w.drop, 0.0) for w in self.winners)

    @property
    def name(self) -> str:
        return COMPOSED_PREFIX + "+".join(str(n) for n in sorted({w.number for w in self.winners}))

    def describe(self) -> str:
        return f"{' x '.join(w.component.describe() for w in self.winners)} x {self.runtime}"


def _key(configs: Iterable[StageConfig]) -> str:
    return json.dumps([c.to_dict() for c in configs], sort_keys=True, default=str)


def is_numeric(config: StageConfig) -> bool:
    """Whether ``config``'s stage changes numerics (its own component) rather than the float graph."""
    return stage_for(config).numeric


def measured(record: TrialRecord, feasible: bool, export_nodes: Collection[str]) -> Measured | None:
    """The :class:`Measured` form of a complete, feasible trial record (None for any other)."""
    speedup = record.metrics.get("speedup")
    if not feasible or record.recipe is None or speedup is None:
        return None
    requested = tuple((node, config) for node, config in record.configs.items()
                      if config is not None and node not in export_nodes)
    return Measured(record.number, record.runtime, requested, tuple(record.recipe.model_stages()),
                    float(speedup), float(record.metrics.get("metric_drop", 0.0)))


def components(stages: Sequence[NodeConfig], numeric: Callable[[StageConfig], bool] = is_numeric) -> list[Component]:
    """``stages`` split into components: each numeric stage alone, consecutive structural stages together."""
    parts: list[list[NodeConfig]] = []
    structural = False
    for node, config in stages:
        if numeric(config) or not structural:
            parts.append([])
        parts[-1].append((node, config))
        structural = not numeric(config)
    return [Component(tuple(part), precision=stage_for(part[0][1]).lowers_precision) for part in parts]


def _origins(trials: Sequence[Measured]) -> dict[str, StageConfig]:
    """Resolved config -> the config the earliest trial asked for (a runtime sweep replays resolved configs:
    a replay is the same technique as the trial it replays)."""
    origins: dict[str, StageConfig] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        if len(trial.resolved) != len(trial.requested):
            continue
        for (_, asked), resolved in zip(trial.requested, trial.resolved, strict=True):
            origins.setdefault(_key([resolved]), asked)
    return origins


def _canonical(trial: Measured, origins: Mapping[str, StageConfig]) -> tuple[NodeConfig, ...]:
    return tuple((node, origins.get(_key([config]), config)) for node, config in trial.requested)


def winners(trials: Sequence[Measured], per_axis: int,
            numeric: Callable[[StageConfig], bool] = is_numeric) -> list[Winner]:
    """The ``per_axis`` components of highest gain (> :data:`MIN_GAIN`) of each axis, from single-technique
    trials; axes in the order they were first measured, each best first (ties: earlier trial)."""
    plain: dict[str, float] = {}
    for trial in trials:
        if not trial.requested:
            plain[trial.runtime] = max(plain.get(trial.runtime, 0.0), trial.speedup)
    origins = _origins(trials)
    best: dict[str, Winner] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        parts = components(_canonical(trial, origins), numeric)
        if len(parts) != 1:
            continue
        factor = plain.get(trial.runtime)
        gain = trial.speedup / factor if factor else trial.speedup
        current = best.get(parts[0].key)
        if current is None or gain > current.gain:
            best[parts[0].key] = Winner(parts[0], gain, trial.drop, trial.number)
    by_axis: dict[tuple[str, ...], list[Winner]] = {}
    for winner in best.values():
        if winner.gain > MIN_GAIN:
            by_axis.setdefault(winner.component.nodes, []).append(winner)
    return [w for axis in by_axis.values() for w in sorted(axis, key=lambda w: (-w.gain, w.number))[:per_axis]]


def winning_runtimes(trials: Sequence[Measured], runtimes: Sequence[str], count: int) -> list[str]:
    """The ``count`` runtimes (of ``runtimes``) whose fastest feasible trial is fastest, fastest first."""
    fastest = {r: max((t.speedup for t in trials if t.runtime == r), default=0.0) for r in runtimes}
    measured_runtimes = [r for r in runtimes if fastest[r] > 0.0]
    return sorted(measured_runtimes, key=lambda r: (-fastest[r], runtimes.index(r)))[:count]


def _disjoint_sets(candidates: Sequence[Winner]) -> list[tuple[Winner, ...]]:
    """Every set of two or more winners on pairwise disjoint nodes."""
    found: list[tuple[Winner, ...]] = []

    def extend(chosen: tuple[Winner, ...], start: int) -> None:
        if len(chosen) >= 2:
            found.append(chosen)
        used = {node for w in chosen for node in w.component.nodes}
        for index in range(start, len(candidates)):
            if not used & set(candidates[index].component.nodes):
                extend((*chosen, candidates[index]), index + 1)

    extend((), 0)
    return found


def compositions(trials: Sequence[Measured], runtimes: Sequence[str], order: Sequence[str], allowed_drop: float,
                 known: Callable[[Sequence[StageConfig], str], bool], limit: int, per_axis: int = 2,
                 runtime_count: int = 2, numeric: Callable[[StageConfig], bool] = is_numeric,
                 worth: Callable[[Composition], bool] | None = None) -> list[Composition]:
    """At most ``limit`` compositions of measured winners that ``known`` does not skip (measured or queued
    already, or a runtime that cannot run them) or ``worth`` rejects (a measured dead end), best
    estimated first: likely within ``allowed_drop`` (the components' drops added), then the product of
    the gains, then the runtime's rank. ``order``: the stage nodes in pipeline order. Deterministic."""
    if limit <= 0:
        return []
    position = {node: i for i, node in enumerate(order)}
    ranked_runtimes = winning_runtimes(trials, runtimes, runtime_count)
    candidates = sorted(winners(trials, per_axis, numeric),
                        key=lambda w: (position.get(w.component.nodes[0], len(position)), -w.gain, w.number))
    sets = [tuple(sorted(s, key=lambda w: position.get(w.component.nodes[0], len(position))))
            for s in _disjoint_sets(candidates)]
    options = [Composition(s, runtime) for s in sets for runtime in ranked_runtimes]
    options.sort(key=lambda c: (c.estimated_drop > allowed_drop, -c.estimated_gain, len(c.winners),
                                ranked_runtimes.index(c.runtime), _key(c.configs)))
    chosen: list[Composition] = []
    for option in options:
        if len(chosen) >= limit:
            break
        if not known(option.configs, option.runtime) and (worth is None or worth(option)):
            chosen.append(option)
    return chosen


def composed_count(trials: Iterable[FrozenTrial]) -> int:
    """How many trials of a study were enqueued as compositions (run, running or waiting)."""
    return sum(1 for t in trials if str(t.user_attrs.get(ATTR_SEED, "")).startswith(COMPOSED_PREFIX))


def composed_note(trials: Sequence[FrozenTrial]) -> str | None:
    """The end-of-search line: how many composed trials ran (None: none)."""
    count = composed_count(t for t in trials if t.state.is_finished())
    return f"{count} trial(s) composed from measured winners (seed '{COMPOSED_PREFIX}...')" if count else None
