"""How fast a search gets its results: the best feasible speed-up so far against wall time, the time to reach
the final best, and where the search's time went (issue 25: results in minutes, not hours).

:func:`best_so_far` is the product's curve with each point's recipe; :func:`time_split` the search's own
tallies (``SearchTimes`` and the runner's stage tallies); :func:`render` writes both for BENCHMARKS.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TypedDict

from optuna.trial import FrozenTrial

from paretorch.pipeline.engine.recipe import Recipe, describe_config
from paretorch.pipeline.search.objectives import ATTR_RECIPE
from paretorch.pipeline.search.time_to_result import best_so_far as study_best_so_far

#: The bench's goal for the best-so-far curve: the peers' level within this many seconds of the search.
EARLY_SECONDS = 600.0


class TimelinePoint(TypedDict):
    """A point of the best-so-far curve: seconds since the search started, the best speed-up, its trial and recipe."""

    seconds: float
    speedup: float
    trial: int
    recipe: str


class TimeSplit(TypedDict):
    """Where a search's wall seconds went: the runner's time categories, the stages by name, and the rest."""

    wall: float
    categories: dict[str, float]
    stages: dict[str, float]
    other: float


class SearchTimes(TypedDict, total=False):
    """What :func:`render` reads of a search's summary (result files written before these were recorded lack them)."""

    timeline: list[TimelinePoint]
    time_split: TimeSplit
    best_trial: int


def best_so_far(trials: Sequence[FrozenTrial], started: datetime) -> list[TimelinePoint]:
    """The product's best-so-far curve (:func:`paretorch.pipeline.search.time_to_result.best_so_far`: complete,
    feasible, timing-trusted trials that raised the best paired speed-up, in completion order) as the bench writes it:
    ``seconds`` since ``started``, ``speedup``, ``trial`` and the trial's ``recipe`` text."""
    by_number = {t.number: t for t in trials}
    return [{"seconds": p.seconds, "speedup": p.speedup, "trial": p.trial,
             "recipe": _describe(Recipe.from_dict(recipe))
             if (recipe := by_number[p.trial].user_attrs.get(ATTR_RECIPE)) else "?"}
            for p in study_best_so_far(trials, started)]


def trial_ends(trials: Sequence[FrozenTrial], started: datetime) -> list[float]:
    """Seconds from ``started`` to each finished trial's end, by trial number (the study's start inside the first)."""
    return [max(0.0, (t.datetime_complete - started).total_seconds())
            for t in sorted(trials, key=lambda t: t.number) if t.datetime_complete is not None]


def _describe(recipe: Recipe) -> str:
    """``amp(dtype=bfloat16, ...) @ compile`` (no ``|``: the text goes into a Markdown table)."""
    body = " + ".join(describe_config(c, brief=True) for c in recipe.model_stages()) or "fp32"
    return f"{body} @ {recipe.runtime}"


def time_to_best(points: Sequence[TimelinePoint]) -> float | None:
    """Seconds until the final best was reached (None: no feasible trial)."""
    return float(points[-1]["seconds"]) if points else None


def best_within(points: Sequence[TimelinePoint], seconds: float) -> float | None:
    """The best speed-up reached within ``seconds`` of the start (None: none yet)."""
    reached = [float(p["speedup"]) for p in points if float(p["seconds"]) <= seconds]
    return max(reached) if reached else None


def time_split(wall: float, categories: Mapping[str, float], stage_seconds: Mapping[str, float]) -> TimeSplit:
    """Where the search's ``wall`` seconds went: the runner's time categories (model load, stages, evaluation,
    exports, runtime sessions), the stages by name, and the rest (search, tracking, I/O)."""
    return {"wall": wall, "categories": dict(categories), "stages": dict(stage_seconds),
            "other": max(0.0, wall - sum(categories.values()))}


def _share(seconds: float, wall: float) -> str:
    return f"{seconds:.0f} s ({100 * seconds / wall:.0f} %)" if wall else f"{seconds:.0f} s"


def render(search: SearchTimes, peer_speedup: float | None = None) -> list[str]:
    """BENCHMARKS.md lines for a search's timeline (``search["timeline"]``) and time split
    (``search["time_split"]``); ``peer_speedup``: the fastest peer row's speed-up, to say when the search reached it.
    Empty for result files written before these were recorded."""
    lines: list[str] = []
    points = search.get("timeline")
    if points is not None:
        final = time_to_best(points)
        early = best_within(points, EARLY_SECONDS)
        head = ("Best feasible speed-up so far (search-time, paired with fp32 eager) against wall time: final best "
                + (f"{points[-1]['speedup']:.2f}x reached after {final:.0f} s (trial {points[-1]['trial']}); "
                   if final is not None else "none; ")
                + f"best within the first {EARLY_SECONDS:.0f} s: " + (f"{early:.2f}x" if early else "none"))
        lead = search.get("best_trial")
        if points and lead is not None and points[-1]["trial"] != lead:  # the curve reads point values
            head += (f"; the search's best is trial {lead}, the front's lead: trial {points[-1]['trial']}'s point "
                     "value is higher, but the front rule does not rank it above (tied within their intervals, or "
                     "a lower metric), so it is not named best")
        if peer_speedup:
            reached = next((p for p in points if float(p["speedup"]) >= peer_speedup), None)
            head += (f"; the fastest peer's {peer_speedup:.2f}x reached after {reached['seconds']:.0f} s"
                     if reached else f"; the fastest peer's {peer_speedup:.2f}x never reached")
        lines += ["", head + ".", "", "| wall time | best speed-up | trial | recipe |", "| --- | --- | --- | --- |"]
        lines += [f"| {p['seconds'] / 60:.1f} min | {p['speedup']:.2f}x | {p['trial']} | `{p['recipe']}` |"
                  for p in points]
    split = search.get("time_split")
    if split:
        wall = float(split["wall"])
        parts = [f"{name} {_share(float(s), wall)}" for name, s in split["categories"].items() if s]
        stages = [f"{name} {_share(float(s), wall)}" for name, s in
                  sorted(split["stages"].items(), key=lambda item: -float(item[1])) if s]
        lines += ["", f"Where the search's {wall:.0f} s went: {', '.join(parts)}; search, tracking and I/O "
                  f"{_share(float(split['other']), wall)}. Stages (low-fidelity screens included): "
                  + (", ".join(stages) or "none") + "."]
    return lines
