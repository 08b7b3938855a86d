"""The front, measured again: its trials and the baseline timed interleaved, in one process.

During a search each trial is timed once, minutes apart from the baseline; on a loaded
machine that skews speed-ups either way (a plain ``torch.compile`` showed 28x where back to
back it is 1.2x). Before the report, :func:`remeasure` times the baseline and every distinct
front trial in rounds (each round times each model once, in turn), so slow periods hit all
of them alike. Each latency is the median of the per-round medians with its 95% interval
(pipeline/core/noise.py); speed-ups divide the baseline's re-measured median, and rows whose
intervals overlap are ties (:func:`~pipeline.search.pareto.mark_ties`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from optuna.trial import FrozenTrial
from torch import Tensor

from pipeline.core.device import move_module
from pipeline.core.evaluate import LatencySettings, measure_latency
from pipeline.core.noise import median_ci
from pipeline.core.runtime import prepare_runtime
from pipeline.core.spec import Batch, move_batch
from pipeline.core.stage import StageConfig
from pipeline.search.pareto import ParetoRow, mark_ties
from pipeline.search.study import Search

#: Key of the baseline among the re-measured candidates.
BASELINE = -1
#: Rounds of the interleaved measurement (9: the smallest count whose 95% median interval is not the full range).
ROUNDS = 9
ROUND_SETTINGS = LatencySettings(warmup_runs=3, min_runs=10, min_seconds=0.05)


@dataclass(frozen=True)
class Remeasured:
    """A latency median over interleaved rounds and its 95% interval (ms)."""

    latency_ms: float
    ci: tuple[float, float]
    rounds: int


def objective_inputs(search: Search) -> Batch:
    """The spec's example inputs at the objective batch size, on the search's device."""
    return move_batch(search.spec.example_inputs(search.objectives.latency_batch), search.device)


def trial_function(search: Search, configs: Mapping[str, StageConfig | None], runtime: str) -> Callable[..., Tensor]:
    """A trial's model (from the runner's cache when it is there) prepared for its runtime."""
    result = search.runner.run(configs, runtime, exports=False, evaluate=False)
    model = move_module(result.nodes[search.pipeline.objective_node().inputs[0]].value, search.device).eval()
    return prepare_runtime(model, runtime, search.device)


def remeasure(search: Search, candidates: Mapping[int, tuple[Mapping[str, StageConfig | None], str]],
              rounds: int = ROUNDS, settings: LatencySettings = ROUND_SETTINGS) -> dict[int, Remeasured]:
    """Time each candidate (key -> (per-node configs, runtime)) at the objective batch, interleaved."""
    device = search.device
    inputs = objective_inputs(search)
    functions = {key: trial_function(search, configs, runtime) for key, (configs, runtime) in candidates.items()}
    samples: dict[int, list[float]] = {key: [] for key in functions}
    with torch.no_grad():
        for _ in range(rounds):
            for key, fn in functions.items():
                samples[key].append(measure_latency(fn, inputs, device, settings).p50_ms)
    return {key: Remeasured(statistics.median(values), median_ci(values), len(values))
            for key, values in samples.items()}


def front_candidates(search: Search, trials: Sequence[FrozenTrial]
                     ) -> dict[int, tuple[Mapping[str, StageConfig | None], str]]:
    """The baseline (all stages off, eager) and the given trials' requested configs and runtimes."""
    candidates: dict[int, tuple[Mapping[str, StageConfig | None], str]] = {BASELINE: ({}, "eager")}
    for trial in trials:
        record = search.record(trial)
        if record.recipe is not None:
            candidates[trial.number] = (record.configs, record.runtime)
    return candidates


def with_remeasured(rows: Sequence[ParetoRow], measured: Mapping[int, Remeasured]) -> list[ParetoRow]:
    """Rows with re-measured latencies, intervals and speed-ups (vs the re-measured baseline), ties marked."""
    base = measured.get(BASELINE)
    updated = []
    for row in rows:
        again = measured.get(row.trial)
        if again is None or base is None:
            updated.append(row)
            continue
        updated.append(replace(row, latency_ms=again.latency_ms, latency_ci=again.ci,
                               speedup=base.latency_ms / again.latency_ms if again.latency_ms > 0 else 0.0))
    return mark_ties(sorted(updated, key=lambda r: (r.latency_ms, -r.metric)))
