"""The Pareto front of a study as a table (rich, and columns for MLflow), and paretorch's best trials: the front's
leads in the table's order (fastest first); the plots: :mod:`.pareto_figure`.

Rows come from what each trial stored in Optuna (its metrics and recipe), so
``python -m paretorch report`` rebuilds the same table from storage alone.

The best trials are one list, decided by :func:`best_trials` from :func:`pareto_rows` (the table's rows: each lead of
the front, :mod:`paretorch.pipeline.search.front_rule`, with its ties), that every surface names: the console's table
(its first row is rank 1), its ``time to result`` line (the lead, rank 1) and its progress bar, MLflow (the metric
:data:`paretorch.pipeline.tracking.columns.RANK_METRIC` on each lead's run, 1 = the table's first row, which the runs
view ``make ui`` opens sorts by; the study run's note), and optuna-dashboard's study note.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rich.table import Table

from paretorch.pipeline.core.input_agreement import cell as inputs_cell
from paretorch.pipeline.core.report import format_bytes
from paretorch.pipeline.core.word_table import WordTable
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.short_recipe import short_recipe
from paretorch.pipeline.search.front_rule import RULE, FrontGroup, candidates, front_groups
from paretorch.pipeline.search.objectives import (
    ATTR_EXPORTS,
    ATTR_METRICS,
    ATTR_RECIPE,
    ATTR_RECIPE_LINE,
    ATTR_REMEASURED,
    ATTR_UNCERTAIN,
    UNCERTAIN,
    Baseline,
    Objectives,
    drop_text,
    stored_interval,
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
    #: Trials tied with this one (:mod:`paretorch.pipeline.search.front_rule`: neither better with confidence; this one
    #: is the simplest recipe), off the point-value front included.
    ties: tuple[int, ...] = ()
    #: 95% interval of the paired speed-up (NaN for a trial measured before paired latency).
    speedup_ci: tuple[float, float] = (math.nan, math.nan)
    #: The speed-up measured again when the study ended, front trials interleaved (NaN: not re-measured).
    remeasured: float = math.nan
    #: The recipe in the short notation the console prints (:mod:`paretorch.pipeline.engine.short_recipe`).
    short: str = ""
    #: The stored export outcome (``{"export.onnx": "ok", ...}``; None: not exported yet): ``exports`` in words.
    export_status: dict[str, str] | None = None
    #: 95% paired bootstrap interval of the metric drop (NaN: not computed), and whether it straddles the allowed drop.
    drop_ci: tuple[float, float] = (math.nan, math.nan)
    uncertain: bool = False
    #: Its inputs against the unoptimized model's, short (:func:`paretorch.pipeline.core.input_agreement.cell`; empty:
    #: not measured).
    inputs: str = ""
    #: The model call's speed-up alone (the objective is the workload's, :mod:`paretorch.pipeline.core.workload`; NaN:
    #: the objective is the model call, or not measured).
    model_call_speedup: float = math.nan

    @property
    def outside(self) -> bool:
        """The re-measured speed-up falls outside the search's 95% interval (the machine changed, or the
        interval was too narrow: read the speed-up with care)."""
        low, high = self.speedup_ci
        return (math.isfinite(self.remeasured) and math.isfinite(low) and math.isfinite(high)
                and not low <= self.remeasured <= high)


def front(study: optuna.Study) -> list[FrontGroup]:
    """The study's front (:mod:`paretorch.pipeline.search.front_rule`): per lead, its repeats and its ties."""
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
        drop_ci=stored_interval(metrics),
        uncertain=bool(trial.user_attrs.get(ATTR_UNCERTAIN)),
        inputs=inputs_cell(metrics),
        model_call_speedup=float(metrics.get("model_call_speedup", math.nan)),
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
    table.add_column("drop [95% CI]", justify="right")
    inputs = any(row.inputs for row in rows)
    if inputs:
        table.add_column("inputs vs unoptimized", justify="right")
    table.add_column(f"p50 ms b{objectives.latency_batch}", justify="right")
    table.add_column("speed-up [95% CI] ~ tied with", justify="right")
    table.add_column("re-timed", justify="right")
    model_call = any(math.isfinite(row.model_call_speedup) for row in rows)
    if model_call:
        table.add_column("model call", justify="right")
    table.add_column("size", justify="right")
    table.add_column("recipe")
    table.add_column("exports")
    if baseline is not None:
        timed_again = any(math.isfinite(r.remeasured) for r in rows)
        table.add_row("-" if baseline.trial is None else str(baseline.trial), f"{baseline.metric_value:.4f}",
                      f"{0.0:+.4f}", *(["-"] if inputs else []), f"{baseline.latency_ms:.3f}", "1.00x",
                      "1.00x" if timed_again else "-", *(["1.00x"] if model_call else []),
                      format_bytes(baseline.size_bytes), "baseline", "", style="dim")
    for row in rows:
        table.add_row(
            str(row.trial),
            f"{row.metric:.4f}",
            drop_text(row.drop, row.drop_ci) + (f" {UNCERTAIN}" if row.uncertain else ""),
            *([row.inputs or "-"] if inputs else []),
            f"{row.latency_ms:.3f}",
            speedup_cell(row) + (f" ~ {', '.join(map(str, row.ties))}" if row.ties else ""),
            remeasured_cell(row),
            *([f"{row.model_call_speedup:.2f}x" if math.isfinite(row.model_call_speedup) else "-"]
              if model_call else []),
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
        "metric_drop_95ci": [drop_text(r.drop, r.drop_ci).partition(" ")[2] for r in rows],
        "uncertain": [r.uncertain for r in rows],
        "inputs": [r.inputs for r in rows],
        objectives.latency_key: [round(r.latency_ms, 3) for r in rows],
        "latency_95ci": [latency_cell(replace(r, ties=())).partition(" ")[2] for r in rows],
        "tied_with": [", ".join(map(str, r.ties)) for r in rows],
        "speedup": [round(r.speedup, 2) for r in rows],
        "speedup_95ci": [speedup_cell(r).partition(" ")[2] for r in rows],
        "speedup_remeasured": [round(r.remeasured, 2) if math.isfinite(r.remeasured) else None for r in rows],
        "model_call_speedup": [round(r.model_call_speedup, 2) if math.isfinite(r.model_call_speedup) else None
                               for r in rows],
        "remeasured_outside_ci": [r.outside for r in rows],
        "size": [format_bytes(r.size_bytes) if math.isfinite(r.size_bytes) else "?" for r in rows],
        "recipe": [r.recipe for r in rows],
        "exports": [r.exports for r in rows],
    }


@dataclass(frozen=True)
class BestTrial:
    """One lead of the front: its place in the table (rank 1 = the first row, the fastest) and its row."""

    rank: int
    row: ParetoRow

    @property
    def number(self) -> int:
        return self.row.trial

    @property
    def speedup(self) -> float:
        return self.row.speedup

    def describe(self, metric_name: str) -> str:
        """``trial 4: 4.11x [3.65, 4.32], accuracy 0.9950, int8s | ort``."""
        return (f"trial {self.number}: {speedup_cell(self.row)}, {metric_name} {self.row.metric:.4f}, "
                f"{self.row.short or self.row.recipe}")


def ranked(rows: Sequence[ParetoRow]) -> list[BestTrial]:
    """The table's rows as best trials, rank 1 first."""
    return [BestTrial(rank, row) for rank, row in enumerate(rows, start=1)]


def best_trials(study: optuna.Study, objectives: Objectives) -> list[BestTrial]:
    """paretorch's best trials of ``study``: the front's leads, in the table's order (empty: no feasible trial)."""
    return ranked(pareto_rows(study, objectives))


def best_numbers(best: Sequence[BestTrial]) -> str:
    """``4, then 11``: the trial numbers in rank order, in words."""
    return ", then ".join(str(b.number) for b in best) or "none"
