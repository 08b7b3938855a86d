"""The front, measured again: its trials and the baseline timed interleaved, in one process.

During the search each trial is timed paired with the baseline (:mod:`paretorch.pipeline.core.paired`), and
the front is chosen from those paired speed-ups. When the study ends, :func:`remeasure` times the
baseline and every distinct front trial once more in rounds (each round times each model once, in
turn, the order reversed every other round; the study's latency settings, each runtime on its own
inputs, as in the search), so slow periods hit all of them alike: a check of the front side by side,
shown as its own column ("re-measured") next to the in-search paired speed-up, never in its place,
and flagged where it falls outside the search's interval (:attr:`ParetoRow.outside`). Each latency is
the median of the per-round medians with its 95% interval (pipeline/core/noise.py); the re-measured
speed-up divides the baseline's re-measured median.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import optuna
from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.noise import median_ci
from paretorch.pipeline.core.paired import noise_line
from paretorch.pipeline.core.progress import phase
from paretorch.pipeline.core.stage import StageConfig
from paretorch.pipeline.search.objectives import ATTR_FEASIBLE, ATTR_LATENCY_UNSTABLE, ATTR_METRICS, ATTR_REMEASURED
from paretorch.pipeline.search.pareto import ParetoRow, distinct_front, pareto_rows
from paretorch.pipeline.search.plan import StudyParts
from paretorch.pipeline.search.record import TrialRecord

#: Key of the baseline among the re-measured candidates.
BASELINE = -1


@dataclass(frozen=True)
class Remeasured:
    """A latency median over interleaved rounds and its 95% interval (ms)."""

    latency_ms: float
    ci: tuple[float, float]
    rounds: int


def remeasure(parts: StudyParts, candidates: Mapping[int, tuple[Mapping[str, StageConfig | None], str]]
              ) -> dict[int, Remeasured]:
    """Time each candidate (key -> (per-node configs, runtime)) at the objective batch, interleaved
    (the search's round timer and settings: :meth:`StudyLatency.together`)."""
    sides = {key: parts.latency.side(configs, runtime) for key, (configs, runtime) in candidates.items()}
    samples = parts.latency.together(list(sides.values()))
    return {key: Remeasured(statistics.median(values), median_ci(values), len(values))
            for key, values in zip(sides, samples, strict=True)}


def front_candidates(parts: StudyParts, trials: Sequence[FrozenTrial]
                     ) -> dict[int, tuple[Mapping[str, StageConfig | None], str]]:
    """The baseline (all stages off, eager) and the given trials' requested configs and runtimes."""
    candidates: dict[int, tuple[Mapping[str, StageConfig | None], str]] = {BASELINE: ({}, DEFAULT_RUNTIME)}
    for trial in trials:
        record = TrialRecord.from_trial(trial)
        if record.recipe is not None:
            candidates[trial.number] = (record.configs, record.runtime)
    return candidates


def remeasured_speedups(measured: Mapping[int, Remeasured]) -> dict[int, float]:
    """Per re-measured trial, its speed-up over the re-measured baseline."""
    base = measured.get(BASELINE)
    if base is None:
        return {}
    return {key: base.latency_ms / again.latency_ms if again.latency_ms > 0 else 0.0
            for key, again in measured.items() if key != BASELINE}


def with_remeasured(rows: Sequence[ParetoRow], measured: Mapping[int, Remeasured]) -> list[ParetoRow]:
    """Rows with their re-measured speed-up (vs the re-measured baseline) in its own column; the in-search
    paired numbers, the order and the ties stay."""
    speedups = remeasured_speedups(measured)
    return [replace(row, remeasured=speedups[row.trial]) if row.trial in speedups else row for row in rows]


def machine_line(study: optuna.Study) -> str | None:
    """How noisy the study's machine was, from its complete trials' paired measurements
    (:func:`paretorch.pipeline.core.paired.noise_line`). Only a trial within the allowed drop (feasible) counts as kept
    off the front by its timing: one over the drop is off it for its metric, whatever its timing."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    unstable = sum(1 for t in done if ATTR_LATENCY_UNSTABLE in t.user_attrs and t.user_attrs.get(ATTR_FEASIBLE))
    return noise_line([t.user_attrs.get(ATTR_METRICS, {}) for t in done], unstable)


@dataclass(frozen=True)
class Retimed:
    """The front's table rows with their re-measured speed-ups, and what the table says about the re-measure."""

    rows: list[ParetoRow]
    #: Re-measured speed-up by trial number (empty: nothing re-measured now).
    speedups: dict[int, float]
    #: The baseline's re-measured latency (ms); None when nothing was re-measured now.
    baseline_ms: float | None
    note: str


def retime_front(parts: StudyParts, study: optuna.Study, changed: bool) -> Retimed:
    """The front re-timed with the baseline, interleaved, when the study ``changed`` or a front trial has no stored
    re-measure (the speed-ups are stored on the study); else the rows as the last run left them."""
    rows = pareto_rows(study, parts.objectives)
    front = [t for t, _ in distinct_front(study)]
    stored = study.user_attrs.get(ATTR_REMEASURED, {})
    if not changed and all(str(t.number) in stored for t in front):
        return Retimed(rows, {}, None, "re-timed: when the study's trials last ran (stored; nothing ran since)")
    rounds = parts.latency.settings.rounds
    with phase(f"re-measuring the front for the table: {len(front)} trial(s) and the unoptimized model, "
               f"interleaved, {rounds} rounds"):
        measured = remeasure(parts, front_candidates(parts, front))
    again = remeasured_speedups(measured)
    study.set_user_attr(ATTR_REMEASURED, {str(k): v for k, v in again.items()})
    baseline_ms = measured[BASELINE].latency_ms
    return Retimed(with_remeasured(rows, measured), again, baseline_ms,
                   f"re-timed: the front again with the baseline ({baseline_ms:.3f} ms), interleaved, {rounds} rounds")
