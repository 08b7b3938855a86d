"""The Pareto front of a study as a table (rich, and columns for MLflow) and as plots.

Rows come from what each trial stored in Optuna (its metrics and recipe), so
``python -m pipeline report`` rebuilds the same table from storage alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from optuna.trial import TrialState
from rich.table import Table

from pipeline.core.report import format_bytes
from pipeline.core.word_table import WordTable
from pipeline.engine.recipe import Recipe
from pipeline.engine.short_recipe import short_recipe
from pipeline.search.front_rule import RULE, FrontGroup, candidates, front_groups
from pipeline.search.objectives import (
    ATTR_EXPORTS,
    ATTR_METRICS,
    ATTR_RECIPE,
    ATTR_RECIPE_LINE,
    ATTR_REMEASURED,
    Baseline,
    Objectives,
)

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


#: What the table's latency and speed-up are (its title says it, in ``optimize`` and ``report`` alike).
FRONT_NOTE = ("speed-up: timed paired with the baseline during the search (median of per-round ratios, 95% CI), "
              f"ms = the baseline's p50 / that speed-up; {RULE}; re-timed \"outside\": outside the search's 95% CI")


@dataclass(frozen=True)
class ParetoRow:
    """One trial on the front, in the units a person reads."""

    trial: int
    metric: float
    drop: float
    latency_ms: float
    speedup: float
    size_bytes: float
    recipe: str
    exports: str
    compile_seconds: float = 0.0
    #: 95% interval of the latency objective (the speed-up's, on the baseline's scale; NaN when not measured).
    latency_ci: tuple[float, float] = (math.nan, math.nan)
    #: Trials tied with this one (:mod:`pipeline.search.front_rule`: neither better with confidence; this one is
    #: the simplest recipe), off the point-value front included.
    ties: tuple[int, ...] = ()
    #: 95% interval of the paired speed-up (NaN for a trial measured before paired latency).
    speedup_ci: tuple[float, float] = (math.nan, math.nan)
    #: The speed-up measured again when the study ended, front trials interleaved (NaN: not re-measured).
    remeasured: float = math.nan
    #: The recipe in the short notation the console prints (:mod:`pipeline.engine.short_recipe`).
    short: str = ""
    #: The stored export outcome (``{"export.onnx": "ok", ...}``; None: not exported yet): ``exports`` in words.
    export_status: dict[str, str] | None = None

    @property
    def outside(self) -> bool:
        """The re-measured speed-up falls outside the search's 95% interval (the machine changed, or the
        interval was too narrow: read the speed-up with care)."""
        low, high = self.speedup_ci
        return (math.isfinite(self.remeasured) and math.isfinite(low) and math.isfinite(high)
                and not low <= self.remeasured <= high)


def front(study: optuna.Study) -> list[FrontGroup]:
    """The study's front (:mod:`pipeline.search.front_rule`): per lead, its repeats and its ties."""
    return front_groups(candidates(study))


def pareto_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The front's trials (feasible, beaten by none with confidence; the simplest of each tie), by number."""
    return sorted((g.lead.trial for g in front(study)), key=lambda t: t.number)


def trial_row(trial: FrozenTrial, objectives: Objectives, exports: str = "") -> ParetoRow:
    metrics: Mapping[str, float] = trial.user_attrs.get(ATTR_METRICS, {})
    recipe = Recipe.from_dict(trial.user_attrs[ATTR_RECIPE]) if ATTR_RECIPE in trial.user_attrs else None
    latency, latency_ci = objectives.objective_latency(metrics)
    return ParetoRow(
        trial=trial.number,
        metric=float(metrics.get(objectives.spec.metric.name, math.nan)),
        drop=float(metrics.get("metric_drop", math.nan)),
        latency_ms=latency,
        speedup=float(metrics.get("speedup", math.nan)),
        size_bytes=float(metrics.get("size_bytes", math.nan)),
        # The exports the recipe names are left out: the exports column says which ran.
        recipe=str(trial.user_attrs.get(ATTR_RECIPE_LINE, "")).partition(" | -> ")[0],
        exports=exports,
        compile_seconds=float(metrics.get("compile_seconds", 0.0)),
        latency_ci=latency_ci,
        speedup_ci=(float(metrics.get("speedup_ci_low", math.nan)), float(metrics.get("speedup_ci_high", math.nan))),
        short=short_recipe(recipe.stages, recipe.runtime) if recipe is not None else "",
    )


def distinct_front(study: optuna.Study) -> list[tuple[FrozenTrial, list[int]]]:
    """The front without repeats: samplers re-propose a config (the cache makes the repeat free); each recipe
    is kept once, as its simplest (first) trial, with the numbers of its repeats."""
    return [(g.lead.trial, sorted(g.repeats)) for g in sorted(front(study), key=lambda g: g.lead.trial.number)]


def pareto_rows(study: optuna.Study, objectives: Objectives) -> list[ParetoRow]:
    """Rows of the front, fastest first, each with its ties; export notes and re-measured speed-ups from the
    study's user attrs."""
    attrs = study.user_attrs
    remeasured = attrs.get(ATTR_REMEASURED, {})
    rows = []
    for group in front(study):
        trial, repeats = group.lead.trial, sorted(group.repeats)
        status = attrs.get(export_attr(trial.number))
        row = replace(trial_row(trial, objectives, _export_note(status)), export_status=status)
        row = replace(row, ties=tuple(sorted(group.tied)))
        if str(trial.number) in remeasured:
            row = replace(row, remeasured=float(remeasured[str(trial.number)]))
        if repeats:
            again = f" (again in {', '.join(map(str, repeats))})"
            row = replace(row, recipe=row.recipe + again, short=row.short + again)
        rows.append(row)
    return sorted(rows, key=lambda r: (r.latency_ms, -r.metric))


def latency_cell(row: ParetoRow) -> str:
    """``0.207 [0.201, 0.215]``: the median and its 95% interval; ``~ 3, 5`` when tied with those trials."""
    text = f"{row.latency_ms:.3f}"
    if all(math.isfinite(v) for v in row.latency_ci):
        text += f" [{row.latency_ci[0]:.3f}, {row.latency_ci[1]:.3f}]"
    if row.ties:
        text += f" ~ {', '.join(map(str, row.ties))}"
    return text


def remeasured_cell(row: ParetoRow) -> str:
    """``4.68x``, ``4.68x outside`` when it falls outside the search's interval, ``-`` when not re-measured."""
    if not math.isfinite(row.remeasured):
        return "-"
    return f"{row.remeasured:.2f}x" + (" outside" if row.outside else "")


def speedup_cell(row: ParetoRow) -> str:
    """``2.41x [2.30, 2.52]``: the paired speed-up and its 95% interval."""
    text = f"{row.speedup:.2f}x"
    if all(math.isfinite(v) for v in row.speedup_ci):
        text += f" [{row.speedup_ci[0]:.2f}, {row.speedup_ci[1]:.2f}]"
    return text


def export_attr(trial_number: int) -> str:
    """The study user attr holding trial ``trial_number``'s export outcome."""
    return f"{ATTR_EXPORTS}.{trial_number}"


def _export_note(note: Mapping[str, str] | None) -> str:
    """``{"export.onnx": "ok", "export.coreml": "infeasible: ..."}`` -> ``onnx, coreml (infeasible: ...)``."""
    if note is None:
        return "not exported yet"
    if not note:
        return "none"
    parts = []
    for name, status in note.items():
        short = name.removeprefix("export.")
        parts.append(short if status == "ok" else f"{short} ({status})")
    return ", ".join(parts) or "none"


def exports_cell(status: Mapping[str, str] | None) -> str:
    """The console's exports cell: ``onnx, no coreml`` (why not: the notes under the table), ``none``, or
    ``not yet``."""
    if status is None:
        return "not yet"
    names = [name.removeprefix("export.") for name in status]
    return ", ".join(n if s == "ok" else f"no {n}" for n, s in zip(names, status.values(), strict=True)) or "none"


def pareto_table(rows: Sequence[ParetoRow], objectives: Objectives, title: str,
                 baseline: Baseline | None = None, notes: Sequence[str] = ()) -> Table:
    """The table printed at the end of ``optimize`` and by ``report``, readable at 80 columns: a one-line
    ``title``, the baseline's row first, each recipe in the short notation (the full one is in the recipe file
    and MLflow); under it ``notes`` (what the numbers are) and the allowed drop. A cell wraps between words,
    never inside one."""
    metric = objectives.spec.metric.name
    table = WordTable(title=title, header_style="bold", caption_justify="left",
                      caption="; ".join([*notes, f"allowed drop: {objectives.describe_drop(baseline)}"]))
    table.add_column("trial", justify="right")
    table.add_column(metric.replace("_", " "), justify="right")
    table.add_column("drop", justify="right")
    table.add_column(f"p50 ms b{objectives.latency_batch}", justify="right")
    table.add_column("speed-up [95% CI] ~ tied with", justify="right")
    table.add_column("re-timed", justify="right")
    table.add_column("size", justify="right")
    table.add_column("recipe")
    table.add_column("exports")
    if baseline is not None:
        timed_again = any(math.isfinite(r.remeasured) for r in rows)
        table.add_row("-" if baseline.trial is None else str(baseline.trial), f"{baseline.metric_value:.4f}",
                      f"{0.0:+.4f}", f"{baseline.latency_ms:.3f}", "1.00x", "1.00x" if timed_again else "-",
                      format_bytes(baseline.size_bytes), "baseline", "", style="dim")
    for row in rows:
        table.add_row(
            str(row.trial),
            f"{row.metric:.4f}",
            f"{row.drop:+.4f}",
            f"{row.latency_ms:.3f}",
            speedup_cell(row) + (f" ~ {', '.join(map(str, row.ties))}" if row.ties else ""),
            remeasured_cell(row),
            format_bytes(row.size_bytes) if math.isfinite(row.size_bytes) else "?",
            row.short or row.recipe,
            exports_cell(row.export_status),
        )
    return table


def table_columns(rows: Sequence[ParetoRow], objectives: Objectives) -> dict[str, list[Any]]:
    """The same table as columns, for ``MlflowClient.log_table``, rounded as the printed table is."""
    return {
        "trial": [r.trial for r in rows],
        objectives.spec.metric.name: [round(r.metric, 4) for r in rows],
        "metric_drop": [round(r.drop, 4) for r in rows],
        objectives.latency_key: [round(r.latency_ms, 3) for r in rows],
        "latency_95ci": [latency_cell(replace(r, ties=())).partition(" ")[2] for r in rows],
        "tied_with": [", ".join(map(str, r.ties)) for r in rows],
        "speedup": [round(r.speedup, 2) for r in rows],
        "speedup_95ci": [speedup_cell(r).partition(" ")[2] for r in rows],
        "speedup_remeasured": [round(r.remeasured, 2) if math.isfinite(r.remeasured) else None for r in rows],
        "remeasured_outside_ci": [r.outside for r in rows],
        "size": [format_bytes(r.size_bytes) if math.isfinite(r.size_bytes) else "?" for r in rows],
        "recipe": [r.recipe for r in rows],
        "exports": [r.exports for r in rows],
    }


# --------------------------------------------------------------------------- plots


@dataclass(frozen=True)
class _Point:
    trial: int
    latency_ms: float
    metric: float
    feasible: bool
    pareto: bool
    recipe: str


def _points(study: optuna.Study, objectives: Objectives) -> list[_Point]:
    front = {n for trial, repeats in distinct_front(study) for n in (trial.number, *repeats)}
    points = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        row = trial_row(trial, objectives)
        feasible = all(v <= 0 for v in trial.constraints.values())
        points.append(_Point(trial.number, row.latency_ms, row.metric, feasible, trial.number in front, row.recipe))
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
    return _Frame(xlim, ylim, log_x, [p for p in feasible if not p.pareto], inside, outside, edge,
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


def pareto_figure_png(study: optuna.Study, objectives: Objectives, baseline: Baseline | None) -> Any:
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


def pareto_figure_html(study: optuna.Study, objectives: Objectives, baseline: Baseline | None) -> Any:
    """The same plot in plotly, on the same axes (interactive; hover shows each trial's recipe and, for a trial
    drawn on the edge, its real latency and metric)."""
    import plotly.graph_objects as go

    frame = _frame(_points(study, objectives), objectives, baseline)
    figure = go.Figure()
    groups = (
        ("feasible", frame.others, [(p.latency_ms, p.metric) for p in frame.others], "circle", "gray"),
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
