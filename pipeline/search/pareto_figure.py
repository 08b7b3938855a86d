"""The Pareto plots of a study (matplotlib for the parent run's PNG, plotly for its HTML): scaled to the feasible
trials and the baseline, the front as a step line with one label per point, trials over the allowed drop that fall
outside drawn on the axes' edge. The points come from the same trial rows as the table
(:mod:`paretorch.pipeline.search.pareto`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from paretorch.pipeline.search.objectives import ATTR_FEASIBLE, ATTR_LATENCY_UNSTABLE, Baseline, Objectives
from paretorch.pipeline.search.pareto import distinct_front, trial_row

if TYPE_CHECKING:
    import optuna
    from matplotlib.figure import Figure
    from plotly.graph_objects import Figure as PlotlyFigure


#: The legend of trials within the allowed drop that the front left out for their timing.
UNSTABLE_LABEL = "within the drop, timing unstable (off the front)"


@dataclass(frozen=True)
class _Point:
    trial: int
    latency_ms: float
    metric: float
    feasible: bool
    pareto: bool
    recipe: str
    #: Within the allowed drop, but kept off the front because its timing never settled (a busy machine).
    unstable: bool = False


def _points(study: optuna.Study, objectives: Objectives) -> list[_Point]:
    front = {n for trial, repeats in distinct_front(study) for n in (trial.number, *repeats)}
    points = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        row = trial_row(trial, objectives)
        unstable = bool(trial.user_attrs.get(ATTR_LATENCY_UNSTABLE))
        # within the allowed drop (the trial's verdict); an unstable trial's constraint is positive for Optuna only
        feasible = bool(trial.user_attrs.get(ATTR_FEASIBLE, all(v <= 0 for v in trial.constraints.values())))
        points.append(_Point(trial.number, row.latency_ms, row.metric, feasible, trial.number in front, row.recipe,
                             unstable and feasible))
    return points


#: The latency axis is logarithmic when its largest value is more than this many times its smallest.
LOG_SCALE_RATIO = 20.0


def _limits(values: Sequence[float], pad: float = 0.08, floor: float = 1e-9, log: bool = False) -> tuple[float, float]:
    if log:
        low, high = _limits([math.log10(v) for v in values], pad, floor)
        return 10.0**low, 10.0**high
    low, high = min(values), max(values)
    span = max(high - low, abs(high) * 0.02, floor)
    return low - pad * span, high + pad * span


def log_scale(latencies: Sequence[float]) -> bool:
    """A log latency axis for a wide range (> :data:`LOG_SCALE_RATIO` x between the extremes), where a linear
    one would crowd the fast trials into its first pixels."""
    positive = [v for v in latencies if math.isfinite(v) and v > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_SCALE_RATIO


@dataclass(frozen=True)
class _Frame:
    """What both plots show, and where: axes scaled to the feasible trials and the baseline; the trials over the
    allowed drop inside them, and those outside drawn on the axes' edge (``edge``: their clipped positions)."""

    xlim: tuple[float, float]
    ylim: tuple[float, float]
    log_x: bool
    others: list[_Point]
    #: Within the drop, kept off the front for its timing.
    unstable: list[_Point]
    inside: list[_Point]
    outside: list[_Point]
    edge: list[tuple[float, float]]
    front: list[_Point]
    threshold: float | None


def _frame(points: Sequence[_Point], objectives: Objectives, baseline: Baseline | None) -> _Frame:
    points = [p for p in points if math.isfinite(p.latency_ms) and math.isfinite(p.metric)]
    feasible = [p for p in points if p.feasible]
    threshold = objectives.limit(baseline) if baseline is not None else None
    ys = [p.metric for p in feasible] + ([baseline.metric_value, threshold] if baseline and threshold else [])
    xs = [p.latency_ms for p in feasible] + ([baseline.latency_ms] if baseline else [])
    if not ys:
        ys, xs = [p.metric for p in points] or [0.0], [p.latency_ms for p in points] or [0.0]
    log_x = log_scale(xs) and min(xs) > 0
    ylim, xlim = _limits(ys), _limits(xs, log=log_x)
    over = [p for p in points if not p.feasible]
    inside = [p for p in over if xlim[0] <= p.latency_ms <= xlim[1] and ylim[0] <= p.metric <= ylim[1]]
    outside = [p for p in over if p not in inside]
    edge = [(min(max(p.latency_ms, xlim[0]), xlim[1]), min(max(p.metric, ylim[0]), ylim[1])) for p in outside]
    return _Frame(xlim, ylim, log_x, [p for p in feasible if not p.pareto and not p.unstable],
                  [p for p in feasible if p.unstable], inside, outside, edge,
                  sorted((p for p in points if p.pareto), key=lambda p: p.latency_ms), threshold)


def _latency_label(objectives: Objectives, frame: _Frame) -> str:
    return (f"latency, batch {objectives.latency_batch} (ms): the baseline's p50 / paired speed-up"
            + ("; log scale" if frame.log_x else ""))


def merged_labels(points: Sequence[_Point]) -> list[tuple[float, float, str]]:
    """One label per drawn position: trials at the same (latency, metric) share it (``4, 15, 16``)."""
    groups: dict[tuple[float, float], list[int]] = {}
    for p in points:
        groups.setdefault((round(p.latency_ms, 9), round(p.metric, 9)), []).append(p.trial)
    return [(x, y, ", ".join(map(str, sorted(trials)))) for (x, y), trials in groups.items()]


def pareto_figure_png(study: optuna.Study, objectives: Objectives, baseline: Baseline | None) -> Figure:
    """A matplotlib figure scaled to the feasible trials (a log latency axis when their range is wide): the front
    as a step line with one label per point (repeats merged), the baseline, the allowed-drop line; trials over the
    allowed drop that fall outside the feasible region are drawn on the axes' edge (hollow triangles)."""
    from matplotlib.figure import Figure

    frame = _frame(_points(study, objectives), objectives, baseline)
    figure = Figure(figsize=(8, 5), dpi=110)
    axes = figure.add_subplot()
    if frame.log_x:
        axes.set_xscale("log")
    axes.scatter([p.latency_ms for p in frame.others], [p.metric for p in frame.others], marker="o", c="0.6",
                 label="feasible")
    if frame.unstable:
        axes.scatter([p.latency_ms for p in frame.unstable], [p.metric for p in frame.unstable], marker="D",
                     facecolors="none", edgecolors="tab:orange", label=UNSTABLE_LABEL)
    axes.scatter([p.latency_ms for p in frame.inside], [p.metric for p in frame.inside], marker="x", c="0.6",
                 label="over the allowed drop")
    if frame.outside:
        axes.scatter([x for x, _ in frame.edge], [y for _, y in frame.edge], marker="v", facecolors="none",
                     edgecolors="0.5", clip_on=False,
                     label=f"over the allowed drop, off the chart ({len(frame.outside)})")
    if frame.front:
        axes.step([p.latency_ms for p in frame.front], [p.metric for p in frame.front], where="post", c="tab:red",
                  lw=1)
        axes.scatter([p.latency_ms for p in frame.front], [p.metric for p in frame.front], c="tab:red",
                     label="Pareto front")
        for x, y, label in merged_labels(frame.front):
            axes.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4))
    if baseline is not None and frame.threshold is not None:
        axes.scatter([baseline.latency_ms], [baseline.metric_value], marker="*", s=160, c="tab:blue",
                     label="baseline")
        axes.axhline(frame.threshold, ls="--", c="0.5", lw=0.8,
                     label=f"allowed drop ({objectives.describe_drop(baseline)})")
    axes.set_xlim(*frame.xlim)
    axes.set_ylim(*frame.ylim)
    axes.set_xlabel(_latency_label(objectives, frame))
    axes.set_ylabel(objectives.spec.metric.name)
    axes.set_title(f"{objectives.spec.name}: {objectives.spec.metric.name} vs latency")
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    return figure


def pareto_figure_html(study: optuna.Study, objectives: Objectives, baseline: Baseline | None) -> PlotlyFigure:
    """The same plot in plotly, on the same axes (interactive; hover shows each trial's recipe and, for a trial
    drawn on the edge, its real latency and metric)."""
    import plotly.graph_objects as go

    frame = _frame(_points(study, objectives), objectives, baseline)
    figure = go.Figure()
    groups = (
        ("feasible", frame.others, [(p.latency_ms, p.metric) for p in frame.others], "circle", "gray"),
        (UNSTABLE_LABEL, frame.unstable, [(p.latency_ms, p.metric) for p in frame.unstable], "diamond-open",
         "orange"),
        ("over the allowed drop", frame.inside, [(p.latency_ms, p.metric) for p in frame.inside], "x", "lightgray"),
        (f"over the allowed drop, off the chart ({len(frame.outside)})", frame.outside, frame.edge,
         "triangle-down-open", "gray"),
        ("Pareto front", frame.front, [(p.latency_ms, p.metric) for p in frame.front], "circle", "red"),
    )
    for name, chosen, positions, symbol, color in groups:
        if not chosen:
            continue
        figure.add_trace(go.Scatter(
            x=[x for x, _ in positions], y=[y for _, y in positions], name=name,
            mode="lines+markers" if name == "Pareto front" else "markers", cliponaxis=False,
            line={"shape": "hv"}, marker={"symbol": symbol, "color": color, "size": 9},
            text=[f"trial {p.trial}: {p.recipe} ({p.latency_ms:.4g} ms, {p.metric:.4g})" for p in chosen],
            hoverinfo="text",
        ))
    if baseline is not None:
        figure.add_trace(go.Scatter(x=[baseline.latency_ms], y=[baseline.metric_value], name="baseline",
                                    mode="markers", marker={"symbol": "star", "size": 14, "color": "blue"}))
    if baseline is not None and frame.threshold is not None:
        figure.add_hline(y=frame.threshold, line_dash="dash", line_color="gray",
                         annotation_text=f"allowed drop ({objectives.describe_drop(baseline)})")
    xrange = [math.log10(v) for v in frame.xlim] if frame.log_x else list(frame.xlim)
    figure.update_xaxes(type="log" if frame.log_x else "linear", range=xrange)
    figure.update_yaxes(range=list(frame.ylim))
    figure.update_layout(
        title=f"{objectives.spec.name}: {objectives.spec.metric.name} vs latency",
        xaxis_title=_latency_label(objectives, frame),
        yaxis_title=objectives.spec.metric.name,
    )
    return figure
