"""The runtime sweep's own index: which runtimes each resolved stage list has run under, and which
stage lists are the fastest within the allowed drop.

After each trial the sweep proposes the ``top`` fastest feasible stage lists (each under its best
runtime so far) under every runtime it has not run under yet: the runtime barely interacts with the
stages, yet a sampler needs many trials to pair good stages with a good runtime (with MiniLM on an
H200, a 20-trial TPE search never tried bf16 AMP under CUDA graphs while it swept only the single
fastest stage list). A preset's stage list is not swept: the preset names the runtimes where it can pay (the
CPU MiniLM search spent 6 of 30 trials sweeping presets into runtimes they had left out, e.g. static int8 under
eager at 0.86x), nor a stage list that a list built on it dominates (faster with no larger drop: ``prune depth
0.1`` once ``prune depth 0.1 + int8s`` was measured; the MiniLM CPU search of 2026-11-29 swept ``prune depth 0.1``
under three runtimes after its composition with static int8 had beaten it at 4.11x).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice

from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.search.record import TrialRecord

#: Whether a runtime can run a stage list (resolved stages as dicts), e.g. ONNX Runtime cannot run AMP.
Runnable = Callable[[tuple[dict[str, object], ...], str], bool]


@dataclass(frozen=True)
class SweptStages:
    """A stage list's fastest feasible trial: its objective latency, number and resolved model stages."""

    latency: float
    number: int
    stages: tuple[dict[str, object], ...]
    #: The runtime it ran under.
    runtime: str = DEFAULT_RUNTIME
    #: Its metric drop (positive: worse than the unoptimized model; NaN: not known, never dominated).
    drop: float = math.nan

    def dominated_by(self, other: SweptStages) -> bool:
        """Whether ``other`` builds on these stages (holds each of them, and more) and is faster with no larger
        drop: whatever a faster runtime gives these stages, it gives ``other`` too."""
        return (other.stages != self.stages and all(stage in other.stages for stage in self.stages)
                and other.latency < self.latency and other.drop <= self.drop)


@dataclass(frozen=True)
class SweepProposal:
    """One trial the sweep asks for: the resolved stages of trial ``number`` under ``runtime``."""

    number: int
    stages: tuple[dict[str, object], ...]
    runtime: str
    #: Trial ``number``'s objective latency and the runtime it ran under (what the proposal's estimate moves).
    latency: float = 0.0
    measured_under: str = DEFAULT_RUNTIME


@dataclass
class RuntimeSweepIndex:
    """For the runtime sweep: which runtimes each resolved stage list has run under, and each stage
    list's fastest feasible trial."""

    runtimes: dict[str, set[str]] = field(default_factory=dict)
    best: dict[str, SweptStages] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)
    #: Stage lists whose runtimes were chosen already (a preset names the runtimes where it can pay): not swept.
    chosen: set[str] = field(default_factory=set)

    @property
    def fastest(self) -> float:
        """The fastest feasible latency so far (inf before any)."""
        return min((b.latency for b in self.best.values()), default=float("inf"))

    def add(self, record: TrialRecord, latency: float | None, runtimes_chosen: bool = False) -> float | None:
        """Index ``record`` (once); ``latency``: its objective latency if it is feasible, else None;
        ``runtimes_chosen``: its stage list's runtimes were chosen (a preset's), never swept.
        Returns ``latency`` for the caller's convenience."""
        if record.number in self.seen:
            return latency
        self.seen.add(record.number)
        key = record.stages_key
        if key is None or record.recipe is None:
            return latency
        if runtimes_chosen:
            self.chosen.add(key)
        self.runtimes.setdefault(key, set()).add(record.runtime)
        current = self.best.get(key)
        if latency is not None and (current is None or (latency, record.number) < (current.latency, current.number)):
            stages = tuple(c.to_dict() for c in record.recipe.model_stages())
            self.best[key] = SweptStages(latency, record.number, stages, record.runtime,
                                         float(record.metrics.get("metric_drop", math.nan)))
        return latency

    def top(self, count: int) -> list[tuple[str, SweptStages]]:
        """The ``count`` fastest feasible stage lists (ties: the earlier trial first)."""
        ranked = sorted(self.best.items(), key=lambda item: (item[1].latency, item[1].number))
        return ranked[:count]

    def proposals(self, runtimes: Sequence[str], top: int, runnable: Runnable | None = None,
                  worth: Callable[[SweptStages, str], bool] | None = None) -> list[SweepProposal]:
        """For each of ``runtimes``, the ``top`` fastest feasible stage lists it can run (``runnable``;
        None: all) and that can still win under it (``worth``: not a measured dead end,
        :mod:`paretorch.pipeline.search.dead_ends`), but not those whose runtimes were chosen, that have not run under
        it, fastest stage list first (nothing when there is one runtime), nor those a stage list built on them
        dominates (:meth:`SweptStages.dominated_by`; the unoptimized model's, once a faster feasible list with
        no larger drop was measured: the runtimes alone on it are the float32 presets' work, which wait in the
        queue)."""
        if len(runtimes) < 2:
            return []
        ranked = [(key, best) for key, best in self.top(len(self.best))
                  if not any(best.dominated_by(other) for other in self.best.values())]
        chosen: dict[tuple[str, str], SweepProposal] = {}
        for runtime in runtimes:
            runs = ((key, best) for key, best in ranked
                    if key not in self.chosen and (runnable is None or runnable(best.stages, runtime))
                    and (worth is None or worth(best, runtime)))
            for key, best in islice(runs, top):  # stops asking ``runnable`` once it has the top few
                if runtime not in self.runtimes.get(key, set()):
                    chosen[(key, runtime)] = SweepProposal(best.number, best.stages, runtime, best.latency,
                                                           best.runtime)
        order = {key: i for i, (key, _) in enumerate(ranked)}
        return [chosen[k] for k in sorted(chosen, key=lambda k: (order[k[0]], runtimes.index(k[1])))]
