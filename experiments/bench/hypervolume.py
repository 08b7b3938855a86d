"""Hypervolume of a search's feasible trials, and how it grows trial by trial.

Two objectives, put on scales that mean the same in every run of one study config:

* **share of the allowed drop kept**: ``keep = 1 - drop / allowed``, clipped to [0, 1]. A trial at the
  allowed drop keeps 0, one at (or above) the baseline metric keeps 1: the search is asked to keep the
  metric, not to beat it, and a gain on the evaluation data is mostly noise that would let one lucky
  trial inflate the volume.
* **log speed-up**: ``gain = ln(baseline latency / trial latency)``, clipped at 0 (a trial slower than
  the baseline gains nothing). The log makes a step from 2x to 4x worth a step from 4x to 8x, and
  the paired speed-up makes it independent of how fast the machine ran that day.

The reference point is the baseline at the allowed drop, (keep 0, gain 0); the volume is the area
under the staircase of the front. One recipe with no drop at speed-up ``s`` alone has volume ``ln s``.
Infeasible trials (over the allowed drop, failed, unstable latency) never count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict


@dataclass(frozen=True)
class TrialPoint:
    """One finished trial, in the units the search stores."""

    number: int
    #: Counts against the trial budget (False for a repeat answered by an earlier trial's measurement).
    counted: bool
    #: Complete and within the allowed drop (the study's constraint <= 0).
    feasible: bool
    #: ``drop / allowed drop`` (<= 1 for a feasible trial; negative when the metric beat the baseline).
    drop_share: float
    #: Baseline latency / trial latency.
    speedup: float
    recipe: str = ""
    #: The study the trial belongs to (fronts over several studies name it).
    study: str = ""


def normalised(point: TrialPoint) -> tuple[float, float]:
    """(keep, gain): the share of the allowed drop kept, in [0, 1], and the log speed-up, >= 0."""
    keep = 1.0 - min(max(point.drop_share, 0.0), 1.0)
    return keep, max(math.log(point.speedup), 0.0)


def _usable(point: TrialPoint) -> bool:
    return point.feasible and math.isfinite(point.drop_share) and math.isfinite(point.speedup) and point.speedup > 0


def hypervolume(points: Iterable[TrialPoint]) -> float:
    """The area dominated by the feasible points between them and the reference (keep 0, gain 0)."""
    area, best_gain = 0.0, 0.0
    for keep, gain in sorted((normalised(p) for p in points if _usable(p)), reverse=True):
        if gain > best_gain:  # widest first: each point adds its strip above the best gain so far
            area += keep * (gain - best_gain)
            best_gain = gain
    return area


def pareto_front(points: Iterable[TrialPoint]) -> list[TrialPoint]:
    """The feasible points no other feasible point dominates in (keep, gain), fastest first; of points at the
    same place, the first trial only."""
    usable = sorted((p for p in points if _usable(p)), key=lambda p: p.number)
    places = [normalised(p) for p in usable]
    front, seen = [], set()
    for point, (keep, gain) in zip(usable, places, strict=True):
        dominated = any(k >= keep and g >= gain and (k > keep or g > gain) for k, g in places)
        if not dominated and (keep, gain) not in seen:
            seen.add((keep, gain))
            front.append(point)
    return sorted(front, key=lambda p: -normalised(p)[1])


def counted_prefix(points: Sequence[TrialPoint], trials: int) -> list[TrialPoint]:
    """The points up to and including the ``trials``-th counted trial (in trial-number order)."""
    prefix, counted = [], 0
    for point in sorted(points, key=lambda p: p.number):
        if counted == trials:
            break
        prefix.append(point)
        counted += point.counted
    return prefix


def history(points: Sequence[TrialPoint]) -> list[float]:
    """The hypervolume after each counted trial: entry ``k - 1`` covers the first ``k`` counted trials (and the
    repeats among them). Never decreases."""
    volumes, seen = [], []
    for point in sorted(points, key=lambda p: p.number):
        seen.append(point)
        if point.counted:
            volumes.append(hypervolume(seen))
    return volumes


class FrontPoint(TypedDict):
    """A front's point as a result file writes it: the study and trial, the drop share and speed-up, the recipe."""

    study: str
    trial: int
    drop_share: float
    speedup: float
    recipe: str


class RunVolumes(TypedDict):
    """One study of a comparison: its trials and time, its volume trial by trial and at the compared count, those
    against the longest run's and the union's, and its fronts (after the compared count and at the end)."""

    study: str
    seed: object
    sampler: object
    trials: int
    seconds: float | None
    feasible: int
    unstable: int
    history: list[float]
    hv_at_compare: float | None
    hv_final: float
    vs_reference: float | None
    vs_union: float | None
    front_at_compare: list[FrontPoint]
    front: list[FrontPoint]


class VolumeAnalysis(TypedDict):
    """Studies of one search config compared by volume (:func:`paretorch.experiments.bench.search_quality.analyse`)."""

    compare: int
    target: float
    normalisation: str
    reference: str
    baseline: dict[str, float]
    search: dict[str, object]
    hv_reference: float
    hv_union: float
    union_front: list[FrontPoint]
    runs: list[RunVolumes]
    reached_reference: bool | None
    reached_union: bool | None
