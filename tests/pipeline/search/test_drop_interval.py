"""The metric drop's bootstrap interval in the search (issue 26.3): stored with the trial, ``uncertain`` when it
straddles the allowed drop, shown in the trial line, the Pareto table and the end-of-search notes."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import optuna
import pytest
import torch
from rich.console import Console

from paretorch.pipeline.core.evaluate import ModelReport
from paretorch.pipeline.core.latency import LatencyStats
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.search.objectives import ATTR_UNCERTAIN, Baseline, Objectives, uncertain_note
from paretorch.pipeline.search.pareto import ParetoRow, pareto_table
from paretorch.pipeline.search.record import TrialRecord
from paretorch.pipeline.search.trial_log import TrialLogger

#: The baseline's accuracy on five resamples, and a trial's drops on them (0.000 .. 0.020, point drop 0.010).
BASE = (0.90, 0.92, 0.94, 0.96, 0.98)


def resamples(*drops: float) -> tuple[float, ...]:
    return tuple(b - d for b, d in zip(BASE, drops, strict=True))


def objectives(spec: ModelSpec, max_drop: str = "0.01") -> Objectives:
    return Objectives.create(spec, ["metric", "latency"], max_drop, 8)


def baseline() -> Baseline:
    return Baseline(0.94, 1.0, 1e6, trial=0, metric_resamples=BASE)


def report(metric: float, metric_resamples: tuple[float, ...]) -> ModelReport:
    stats = LatencyStats(8, 0.5, 0.6, 0.5, 0.01, 0.45, 20, 1.0, 0.49, 0.51)
    return ModelReport("accuracy", metric, {8: stats}, 0, 1000, 10, None, "eager", 0.0, "cpu",
                       metric_resamples=metric_resamples)


def test_an_interval_that_straddles_the_allowed_drop_is_uncertain(residual_spec: ModelSpec) -> None:
    judge = objectives(residual_spec)
    straddling = judge.verdict(baseline(), 0.935, resamples=resamples(0.0, 0.005, 0.01, 0.015, 0.02))
    assert straddling.feasible and straddling.uncertain  # drop 0.005 <= 0.01, interval [0.0005, 0.0195]
    over = judge.verdict(baseline(), 0.925, resamples=resamples(0.0, 0.005, 0.01, 0.015, 0.02))
    assert not over.feasible and over.uncertain  # over the line on its point value, within noise of it
    clear = judge.verdict(baseline(), 0.938, resamples=resamples(0.0, 0.001, 0.002, 0.003, 0.004))
    assert clear.feasible and not clear.uncertain  # the whole interval below 0.01
    far = judge.verdict(baseline(), 0.90, resamples=resamples(0.03, 0.035, 0.04, 0.045, 0.05))
    assert not far.feasible and not far.uncertain  # the whole interval above
    assert not judge.verdict(baseline(), 0.935).uncertain  # no resamples, no interval
    legacy = Baseline.from_json(Baseline(0.94, 1.0, 1e6).to_json())
    assert not judge.verdict(legacy, 0.935, resamples=resamples(0.0, 0.005, 0.01, 0.015, 0.02)).uncertain


def test_the_interval_is_stored_as_metrics_and_the_baseline_keeps_its_resamples(residual_spec: ModelSpec) -> None:
    judge = objectives(residual_spec)
    base = judge.baseline_from(report(0.94, BASE), trial=0)
    assert Baseline.from_json(base.to_json()) == base  # the study attr keeps the resamples
    assert Baseline(**json.loads(base.to_json())) == base  # as the search reads the study attr back
    metrics = judge.trial_metrics(report(0.935, resamples(0.0, 0.005, 0.01, 0.015, 0.02)), base)
    # sorted drops 0 .. 0.02 in steps of 0.005: 2.5 % at position 0.1 -> 0.0005, 97.5 % at 3.9 -> 0.0195
    assert metrics["metric_drop_ci_low"] == pytest.approx(0.0005)
    assert metrics["metric_drop_ci_high"] == pytest.approx(0.0195)
    assert {"metric_drop_ci_low", "metric_drop_ci_high"} <= set(judge.headline_keys())  # top-level in MLflow
    assert "metric_drop_ci_low" not in judge.trial_metrics(report(0.935, ()), base)


def test_the_trial_line_shows_the_interval_and_the_word_uncertain(residual_spec: ModelSpec) -> None:
    search = SimpleNamespace(device=torch.device("cpu"), spec=residual_spec, config=SimpleNamespace(exports="pareto"),
                             objectives=objectives(residual_spec))
    console = Console(file=io.StringIO(), width=200)
    metrics = {"accuracy": 0.935, "metric_drop": 0.005, "metric_drop_ci_low": 0.0005, "metric_drop_ci_high": 0.0195,
               "speedup": 2.0}
    trial = TrialRecord(number=4, state="COMPLETE", runtime="eager", metrics=metrics, seconds={"trial": 1.0},
                        feasible=True, uncertain=True)
    TrialLogger(search, None, console).show(trial)  # type: ignore[arg-type]
    line = console.file.getvalue()  # type: ignore[attr-defined]
    assert "accuracy 0.9350 (drop +0.0050 [+0.0005, +0.0195]) uncertain | 2.00x" in line
    stored = optuna.trial.create_trial(values=[0.9, 1.0], user_attrs=trial.user_attrs())
    assert TrialRecord.from_trial(stored).uncertain
    sure = TrialRecord(number=5, state="COMPLETE", runtime="eager", metrics=metrics, feasible=True)
    console = Console(file=io.StringIO(), width=200)
    TrialLogger(search, None, console).show(sure)  # type: ignore[arg-type]
    assert "uncertain" not in console.file.getvalue()  # type: ignore[attr-defined]



def test_the_table_shows_the_interval_beside_the_drop(residual_spec: ModelSpec) -> None:
    row = ParetoRow(7, 0.935, 0.005, 0.25, 2.0, 1e6, "r", "onnx", speedup_ci=(1.9, 2.1),
                    drop_ci=(0.0005, 0.0195), uncertain=True, short="int8d")
    console = Console(file=io.StringIO(), width=100, record=True)
    console.print(pareto_table([row], objectives(residual_spec), "front", baseline()))
    words = console.export_text().split()
    assert {"+0.0050", "[+0.0005,", "+0.0195]", "uncertain"} <= set(words)


def test_the_summary_counts_the_uncertain_trials() -> None:
    trials = [optuna.trial.create_trial(values=[0.9, 1.0], user_attrs={ATTR_UNCERTAIN: True}),
              optuna.trial.create_trial(values=[0.9, 1.0], user_attrs={}),
              optuna.trial.create_trial(values=[0.9, 1.0], user_attrs={ATTR_UNCERTAIN: True})]
    note = uncertain_note(trials)
    assert note is not None and note.startswith("2 trial(s) uncertain:")
    assert uncertain_note(trials[1:2]) is None
