"""The bench's search timeline: best feasible speed-up so far against wall time, and where the time went."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from paretorch.experiments.bench.timeline import best_so_far, best_within, render, time_split, time_to_best
from paretorch.pipeline.search.objectives import ATTR_FEASIBLE, ATTR_LATENCY_UNSTABLE, ATTR_METRICS, ATTR_RECIPE

START = datetime(2026, 11, 25, 12, 0, 0)
BASELINE_MS = 100.0


def trial(number: int, done_s: float, latency: float, feasible: bool = True, paired: float | None = None,
          state: TrialState = TrialState.COMPLETE, unstable: bool = False) -> FrozenTrial:
    metrics: dict[str, Any] = {"latency_ms_p50_b32": latency}
    if paired is not None:
        metrics["speedup"] = paired
    complete = state == TrialState.COMPLETE
    return FrozenTrial(
        number=number, state=state, value=None, values=[0.9, latency] if complete else None,
        datetime_start=START + timedelta(seconds=done_s - 5), datetime_complete=START + timedelta(seconds=done_s),
        params={}, distributions={}, system_attrs={}, intermediate_values={}, trial_id=number,
        user_attrs={ATTR_FEASIBLE: feasible, ATTR_METRICS: metrics, ATTR_LATENCY_UNSTABLE: unstable,
                    ATTR_RECIPE: {"stages": [], "runtime": "compile" if number else "eager"}})


def test_best_so_far_counts_feasible_trials_in_completion_order() -> None:
    trials = [
        trial(0, 10, 100.0, paired=1.0),
        trial(1, 20, 10.0, feasible=False, paired=10.0),  # faster, but over the allowed drop
        trial(2, 30, 31.0, paired=3.2),
        trial(3, 40, 50.0, paired=2.0),  # not a new best
        trial(4, 45, 0.0, state=TrialState.PRUNED),
        trial(6, 50, 25.0),  # no paired speed-up: not a result the curve can place
        trial(7, 55, 26.0, paired=4.0, unstable=True),  # its timing never settled: off the curve
        trial(5, 60, 20.0, paired=3.9),  # a new best, completed after a higher-numbered trial
    ]
    points = best_so_far(trials, started=START)
    assert [(p["seconds"], p["speedup"], p["trial"]) for p in points] == [(10, 1.0, 0), (30, 3.2, 2), (60, 3.9, 5)]
    assert points[1]["recipe"] == "fp32 @ compile"
    assert time_to_best(points) == 60 and time_to_best([]) is None
    assert best_within(points, 35) == 3.2 and best_within(points, 5) is None


def test_the_timeline_and_the_time_split_render_for_benchmarks_md() -> None:
    points = best_so_far([trial(0, 10, 100.0, paired=1.0), trial(2, 700, 30.0, paired=3.5)], START)
    split = time_split(1000.0, {"model_load": 10.0, "stages": 300.0, "evaluation": 500.0, "exports": 0.0},
                       {"distill": 250.0, "amp": 50.0})
    assert split["other"] == 190.0
    text = "\n".join(render({"timeline": points, "time_split": split}, peer_speedup=3.3))
    assert "final best 3.50x reached after 700 s (trial 2)" in text
    assert "best within the first 600 s: 1.00x" in text
    assert "the fastest peer's 3.30x reached after 700 s" in text
    assert "| 11.7 min | 3.50x | 2 | `fp32 @ compile` |" in text
    assert "Where the search's 1000 s went: model_load 10 s (1 %), stages 300 s (30 %), evaluation 500 s (50 %)" in text
    assert "Stages (low-fidelity screens included): distill 250 s (25 %), amp 50 s (5 %)." in text
    assert render({}) == [], "a result file written before the timeline renders as before"


def test_a_point_best_the_front_rule_ties_is_not_called_the_search_best() -> None:
    points = best_so_far([trial(0, 10, 100.0, paired=1.0), trial(3, 100, 30.0, paired=2.99),
                          trial(4, 200, 30.0, paired=3.20)], START)
    tied = "\n".join(render({"timeline": points, "best_trial": 3}))
    assert "final best 3.20x reached after 200 s (trial 4)" in tied
    assert "the search's best is trial 3, the front's lead" in tied
    assert "the front's lead" not in "\n".join(render({"timeline": points, "best_trial": 4}))
