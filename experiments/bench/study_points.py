"""A paretorch study, read back from its Optuna storage alone, as :class:`TrialPoint` rows.

Everything comes from what the search stored: the baseline (study attr), the search config (its
objectives and allowed drop), each trial's objective values, constraint and whether the trial budget
counts it (repeats and ruled-out configurations do not), so a study run on another machine is read
without its model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

from paretorch.experiments.bench.hypervolume import TrialPoint
from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.search.allowed_drop import AllowedDrop
from paretorch.pipeline.search.config import finished_states
from paretorch.pipeline.search.duplicates import not_counted
from paretorch.pipeline.search.objectives import (
    ATTR_BASELINE,
    ATTR_LATENCY_UNSTABLE,
    ATTR_RECIPE_LINE,
    ATTR_SEARCH,
    Baseline,
)

#: The search-config fields two studies must share for their fronts to be compared (the seed may differ).
SAME_SEARCH = ("pipeline", "objectives", "max_drop", "runtimes", "latency_budget", "latency_batch", "disabled")


@dataclass(frozen=True)
class StudyPoints:
    """One study's trials and what they are measured against."""

    name: str
    search: dict[str, object]
    baseline: Baseline
    #: The absolute metric drop allowed against the baseline.
    allowed: float
    points: list[TrialPoint]
    #: Seconds from the first trial's start to the last trial's end (NaN when the storage lacks the times).
    seconds: float
    #: Trials kept off the front because their paired latency was not trusted (a busy machine).
    unstable: int = 0

    @property
    def trials(self) -> int:
        return sum(p.counted for p in self.points)


def study_points(study: optuna.Study) -> StudyPoints:
    """The study's finished trials as points; a :class:`ConfigError` for a study the search did not write."""
    attrs = study.user_attrs
    if ATTR_BASELINE not in attrs or ATTR_SEARCH not in attrs:
        raise ConfigError(f"study '{study.study_name}' has no paretorch baseline or search config: not a study of "
                          "`python -m paretorch optimize` or `make bench`")
    search = dict(attrs[ATTR_SEARCH])
    baseline = Baseline(**attrs[ATTR_BASELINE])
    objectives = list(search.get("objectives", ()))
    if "metric" not in objectives or "latency" not in objectives:
        raise ConfigError(f"study '{study.study_name}' optimizes {objectives}: the hypervolume needs metric and "
                          "latency")
    allowed = AllowedDrop.parse(search["max_drop"]).threshold(baseline.metric_value)
    metric, latency = objectives.index("metric"), objectives.index("latency")
    sign = 1.0 if study.directions[metric] == StudyDirection.MAXIMIZE else -1.0
    trials = study.get_trials(deepcopy=False, states=finished_states())
    points = []
    for trial in sorted(trials, key=lambda t: t.number):
        feasible = (trial.state == TrialState.COMPLETE and trial.values is not None
                    and all(v <= 0 for v in trial.constraints.values()))
        drop_share = speedup = math.nan
        if trial.values is not None:
            drop = sign * (baseline.metric_value - trial.values[metric])
            drop_share = drop / allowed if allowed > 0 else (0.0 if drop <= 0 else math.inf)
            speedup = baseline.latency_ms / trial.values[latency] if trial.values[latency] > 0 else math.nan
        recipe = str(trial.user_attrs.get(ATTR_RECIPE_LINE, "")).partition(" | -> ")[0]
        points.append(TrialPoint(trial.number, not not_counted(trial), feasible, drop_share, speedup, recipe,
                                 study.study_name))
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete for t in trials if t.datetime_complete is not None]
    seconds = (max(ends) - min(starts)).total_seconds() if starts and ends else math.nan
    unstable = sum(ATTR_LATENCY_UNSTABLE in t.user_attrs for t in trials)
    return StudyPoints(study.study_name, search, baseline, allowed, points, seconds, unstable)


def check_comparable(studies: list[StudyPoints]) -> None:
    """A :class:`ConfigError` unless every study searched the same thing (only the sampler seed may differ)."""
    first = studies[0]
    for other in studies[1:]:
        differs = [k for k in SAME_SEARCH if first.search.get(k) != other.search.get(k)]
        if differs:
            key = differs[0]
            raise ConfigError(f"studies '{first.name}' and '{other.name}' search different things ({key}: "
                              f"{first.search.get(key)} vs {other.search.get(key)}): compare studies of one "
                              "search config (pass --study for each)")
