"""The end of a run in which no compression fit (issue 46.5): it says so, names the closest recipe and the
MAX_DROP that would admit it, and what else to try; nothing when a compressed recipe was feasible."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.search.advice import RunSettings, no_compression_advice, suggested_max_drop
from paretorch.pipeline.search.objectives import ATTR_FEASIBLE, ATTR_METRICS, ATTR_RECIPE_LINE, ATTR_SEED

SETTINGS = RunSettings(allowed="1% of the baseline 0.9924 = 0.009924 absolute", labelled=False, trials=20)


def trial(number: int, drop: float | None, feasible: bool, line: str, seed: str | None = None,
          state: TrialState = TrialState.COMPLETE) -> FrozenTrial:
    attrs: dict[str, Any] = {ATTR_FEASIBLE: feasible, ATTR_RECIPE_LINE: line}
    if drop is not None:
        attrs[ATTR_METRICS] = {"metric_drop": drop}
    if seed is not None:
        attrs[ATTR_SEED] = seed
    made = optuna.trial.create_trial(state=state, values=[0.9, 1.0] if state == TrialState.COMPLETE else None,
                                     user_attrs=attrs)
    made.number = number
    return made


BASELINE = trial(0, 0.0, True, "baseline | eager", seed="baseline")


def test_a_front_of_the_baseline_alone_says_so_and_what_would_change_it() -> None:
    trials = [BASELINE, trial(1, 0.078, False, "prune sparse 0.1 | ort"), trial(2, 0.0312, False, "int8d | ort"),
              trial(3, None, False, "int8s | ov", state=TrialState.PRUNED)]
    lines = no_compression_advice(trials, RunSettings(SETTINGS.allowed, False, 20, disabled=("distill",)))
    assert lines[0] == ("no compression fit the allowed drop (1% of the baseline 0.9924 = 0.009924 absolute): the "
                        "front is the unoptimized model alone")
    assert lines[1] == ("  closest: int8d | ort (trial 2) dropped the metric by 0.0312; MAX_DROP=0.032 would admit "
                        "it")
    assert lines[2].startswith("  labelled data: --eval-data FILE")
    assert lines[3] == "  or try more trials (TRIALS=40; 4 ran), or the stages this search disabled (distill)"


def test_with_labels_it_does_not_suggest_labelled_data() -> None:
    lines = no_compression_advice([BASELINE, trial(1, 0.05, False, "int8d | ort")],
                                  RunSettings(SETTINGS.allowed, True, 20))
    assert len(lines) == 3 and not any("--eval-data" in line for line in lines)


def test_nothing_to_say_when_a_compression_fit_or_none_completed() -> None:
    assert no_compression_advice([BASELINE, trial(1, 0.002, True, "int8d | ort"),
                                  trial(2, 0.05, False, "prune 0.5 | eager")], SETTINGS) == []
    assert no_compression_advice([BASELINE, trial(1, None, False, "int8s | ov", state=TrialState.PRUNED)],
                                 SETTINGS) == []


def test_the_suggested_limit_admits_the_drop() -> None:
    for drop in (0.078, 0.0312, 0.01, 0.00123, 1.234, 0.09999):
        limit = suggested_max_drop(drop)
        assert limit >= drop and limit < drop * 1.1, (drop, limit)
    assert suggested_max_drop(0.0312) == 0.032 and suggested_max_drop(0.078) == 0.078
