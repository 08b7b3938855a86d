"""The parent run's Pareto plot: scaled to the feasible region, one label per point."""

from __future__ import annotations

import math
from dataclasses import replace

import optuna
import pytest
from optuna.trial import TrialState

from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.search.front import BASELINE, Remeasured, with_remeasured
from paretorch.pipeline.search.objectives import ATTR_METRICS, ATTR_RECIPE_LINE, Baseline, Objectives
from paretorch.pipeline.search.pareto import (
    latency_cell,
    table_columns,
    trial_row,
)
from paretorch.pipeline.search.pareto_figure import pareto_figure_html, pareto_figure_png


def _study(objectives: Objectives, trials: list[tuple[float, float, str]]) -> optuna.Study:
    study = optuna.create_study(directions=objectives.directions())
    for metric, latency, recipe in trials:
        drop = 0.97 - metric
        study.add_trial(optuna.trial.create_trial(
            values=[metric, latency], state=TrialState.COMPLETE,
            user_attrs={ATTR_METRICS: {objectives.spec.metric.name: metric, objectives.latency_key: latency,
                                       "metric_drop": drop, "speedup": 1.0 / latency, "size_bytes": 1000.0},
                        ATTR_RECIPE_LINE: recipe},
            system_attrs={
                "constraints:metric_drop": objectives.verdict(Baseline(0.97, 1.0, 1000.0), metric).constraint},
        ))
    return study


def test_axes_cover_the_feasible_region_and_repeat_labels_merge(residual_spec: ModelSpec) -> None:
    objectives = Objectives.create(residual_spec, ["metric", "latency"], 0.01, 1)
    study = _study(objectives, [(0.97, 1.0, "baseline"), (0.965, 0.5, "amp"), (0.965, 0.5, "amp"),
                                (0.10, 0.2, "int4 broke it"), (0.80, 9.0, "slow and wrong")])
    figure = pareto_figure_png(study, objectives, Baseline(0.97, 1.0, 1000.0, 0))
    axes = figure.axes[0]
    low, high = axes.get_ylim()
    assert 0.9 < low < 0.96 and 0.97 < high < 1.0, "the infeasible 0.10 and 0.80 do not stretch the axis"
    labels = sorted(a.get_text() for a in axes.texts)
    assert labels == ["0", "1, 2"]
    legend = [t.get_text() for t in axes.get_legend().get_texts()]
    assert "over the allowed drop, off the chart (2)" in legend


def test_logged_table_is_rounded(residual_spec: ModelSpec) -> None:
    objectives = Objectives.create(residual_spec, ["metric", "latency"], 0.01, 1)
    study = _study(objectives, [(0.9666666666, 0.123456789, "amp")])
    columns = table_columns([trial_row(study.trials[0], objectives)], objectives)
    assert columns[objectives.spec.metric.name] == [0.9667]
    assert columns[objectives.latency_key] == [0.123] and columns["size"] == ["1000 B"]


def test_a_row_shows_its_ties_beside_its_latency(residual_spec: ModelSpec) -> None:
    objectives = Objectives.create(residual_spec, ["metric", "latency"], 0.01, 1)
    study = _study(objectives, [(0.97, 1.0, "a")])
    row = replace(trial_row(study.trials[0], objectives), latency_ci=(0.95, 1.05), ties=(1, 4))
    assert latency_cell(row) == "1.000 [0.950, 1.050] ~ 1, 4"


def test_remeasured_speedups_are_a_column_of_their_own(residual_spec: ModelSpec) -> None:
    """The end-of-study re-measure divides the re-measured baseline, and shows next to the in-search
    paired speed-up: the row's speed-up, order and ties stay the stored ones."""
    objectives = Objectives.create(residual_spec, ["metric", "latency"], 0.01, 1)
    study = _study(objectives, [(0.97, 1.0, "a"), (0.96, 0.5, "b")])
    rows = [trial_row(t, objectives) for t in study.trials]
    measured = {BASELINE: Remeasured(2.0, (1.9, 2.1), 9), 0: Remeasured(1.0, (0.9, 1.1), 9),
                1: Remeasured(0.95, (0.9, 1.0), 9)}
    again = with_remeasured(rows, measured)
    assert [(r.trial, r.speedup, r.remeasured) for r in again] == [(0, 1.0, 2.0), (1, 2.0, 2.0 / 0.95)]
    assert table_columns(again, objectives)["speedup_remeasured"] == [2.0, 2.11]


def test_a_wide_latency_range_gets_a_log_axis_in_both_plots(residual_spec: ModelSpec) -> None:
    """Feasible latencies 0.1 to 5 ms (50x): a log axis, so the fast trials are not crowded into its first
    pixels; a trial over the allowed drop at 500 ms does not stretch it (drawn on the edge)."""
    objectives = Objectives.create(residual_spec, ["metric", "latency"], 0.01, 1)
    baseline = Baseline(0.97, 1.0, 1000.0, 0)
    study = _study(objectives, [(0.97, 1.0, "baseline"), (0.965, 0.1, "fast"), (0.968, 5.0, "slow"),
                                (0.50, 500.0, "broken and slow")])
    axes = pareto_figure_png(study, objectives, baseline).axes[0]
    low, high = axes.get_xlim()
    assert axes.get_xscale() == "log" and 0.05 < low < 0.1 and 5.0 < high < 10.0
    assert "over the allowed drop, off the chart (1)" in [t.get_text() for t in axes.get_legend().get_texts()]
    html = pareto_figure_html(study, objectives, baseline)
    assert html.layout.xaxis.type == "log" and html.layout.xaxis.range == pytest.approx([math.log10(low),
                                                                                          math.log10(high)])
    narrow = _study(objectives, [(0.97, 1.0, "baseline"), (0.965, 0.5, "amp")])
    assert pareto_figure_png(narrow, objectives, baseline).axes[0].get_xscale() == "linear"
    assert pareto_figure_html(narrow, objectives, baseline).layout.xaxis.type == "linear"
