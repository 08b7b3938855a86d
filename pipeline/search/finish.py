"""The end of a study: the Pareto trials exported (each with its deployable callable: its ``deploy/`` folder),
their recipes saved, tagged in MLflow (each lead of the front ranked: :func:`~.pareto.best_trials`); the parent
run's note.

Where each Pareto trial's time goes (:func:`profile_calls`): a ``torch.profiler`` trace and a top-operators table in
its folder. The trace is Chrome trace JSON (open it in https://ui.perfetto.dev or chrome://tracing); the table is
``key_averages()`` sorted by self time. CUDA adds the CUDA activity. On MPS the timeline also gets
``torch.mps.profiler`` signposts (view them in Xcode Instruments); that path is unverified without a Mac, and the files
say so.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
import torch
from rich.console import Console
from torch import Tensor
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.paths import results_dir
from paretorch.pipeline.core.runtimes.registry import get_runtime
from paretorch.pipeline.core.spec import Batch
from paretorch.pipeline.core.stage import StageConfig
from paretorch.pipeline.core.text import plain
from paretorch.pipeline.engine.deliver import companions, deliver, delivered
from paretorch.pipeline.engine.deployment import DEPLOY_DIR, save_deployment
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.search.front_rule import dominated_by, front_tags
from paretorch.pipeline.search.objectives import ATTR_DOMINATED_BY, Baseline
from paretorch.pipeline.search.pareto import (
    BestTrial,
    ParetoRow,
    best_numbers,
    distinct_front,
    export_attr,
    pareto_trials,
    table_columns,
)
from paretorch.pipeline.search.plan import StudyParts
from paretorch.pipeline.search.record import WORST_INPUTS_FILE, TrialRecord, worst_inputs_text
from paretorch.pipeline.tracking.columns import RANK_METRIC
from paretorch.pipeline.tracking.tracker import Tracker
from paretorch.pipeline.tracking.views import markdown_table

TRACE_FILE = "profile_trace.json"
TABLE_FILE = "profile_top_ops.txt"
MPS_NOTE = ("MPS: torch.mps.profiler signposts were recorded around these calls (Xcode Instruments); "
            "this path is unverified without a Mac.\n")


def study_dir(name: str) -> Path:
    """``<results>/studies/<study>``: recipes of the Pareto trials."""
    path = results_dir() / "studies" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def study_note(title: str, rows: Sequence[ParetoRow], parts: StudyParts, baseline: Baseline,
               best: Sequence[BestTrial]) -> str:
    """The parent run's Description: paretorch's best trials, the Pareto table and where to look next."""
    columns = table_columns(rows, parts.objectives)
    columns.pop("exports", None)
    return (f"**{title}**\n\n{best_line(best, parts.spec.metric.name)}\n\n{markdown_table(columns)}\n\n"
            f"Plot: Artifacts > pareto.png (interactive: pareto.html). Every trial run not stopped is tagged "
            f"`feasible`, every run `outcome` (complete, stopped: why, failed: why); `reason` says why a trial is not "
            f"a result, "
            f"over the allowed drop "
            f"({parts.objectives.describe_drop(baseline)}) or failed; `dominated_by` names the front trial that "
            f"beats it. Headline metrics are top-level, "
            f"the rest under `detail.`.")


def best_line(best: Sequence[BestTrial], metric_name: str) -> str:
    """The notes' first line: paretorch's best trials in rank order, each with its numbers, the lead to take."""
    if not best:
        return "**paretorch's best trials: none** (no complete trial within the allowed drop yet)."
    ranks = "; ".join(f"{b.rank}. {b.describe(metric_name)}" for b in best)
    return (f"**paretorch's best trials: {best_numbers(best)}** (the Pareto front's leads, fastest first: the "
            f"console's table, its time-to-result line, MLflow's `{RANK_METRIC}` and optuna-dashboard's study note "
            f"list the same trials): {ranks}.")


def finish_study(parts: StudyParts, study: optuna.Study, tracker: Tracker | None, console: Console,
                 best: Sequence[BestTrial]) -> tuple[dict[int, Path], list[str]]:
    """Export the Pareto trials (unless done before), save their recipes, tag them in MLflow and rank the ``best``
    (:data:`RANK_METRIC`, the runs view's sort)."""
    distinct = distinct_front(study)
    dominated = dominated_by(study, pareto_trials(study))
    study.set_user_attr(ATTR_DOMINATED_BY, {str(k): v for k, v in dominated.items()})
    notes: list[str] = []
    if tracker is not None:
        tags = front_tags(study, distinct, dominated)
        for number in tracker.children:
            tracker.set_trial_tags(number, tags.get(number, {"pareto": "false"}))
        tracker.set_trial_ranks(RANK_METRIC, {b.number: b.rank for b in best})
    recipes: dict[int, Path] = {}
    for trial, _repeats in distinct:
        folder = study_dir(parts.study_name) / f"trial-{trial.number:03d}"
        recipe_path = folder / "recipe.json"
        already = export_attr(trial.number) in study.user_attrs and recipe_path.is_file()
        if already and (tracker is None or tracker.trial_tags(trial.number).get("exported") == "true"):
            recipes[trial.number] = recipe_path
            continue
        record = TrialRecord.from_trial(trial)
        if record.recipe is None:
            continue
        recipe = record.recipe
        files: dict[str, list[Path]] = {}
        metrics: dict[str, float] = {}
        if parts.config.exports == "pareto":
            console.print(f"exporting Pareto trial {trial.number}: {recipe.describe()}")
            recipe, files, metrics, status = export_trial(parts, record, folder)
            study.set_user_attr(export_attr(trial.number), status)
            notes.extend(f"trial {trial.number} {k}: {v}" for k, v in status.items() if v != "ok")
        elif export_attr(trial.number) not in study.user_attrs:
            study.set_user_attr(export_attr(trial.number), {})
        recipes[trial.number] = recipe.save(recipe_path)
        if record.worst_inputs:  # beside the recipe: which inputs moved most (MLflow's run holds it too)
            (folder / WORST_INPUTS_FILE).write_text(worst_inputs_text(record.worst_inputs), encoding="utf-8")
        profile = profile_calls(parts.latency.function(record.configs, record.runtime), parts.latency.inputs(),
                                parts.device, folder / "profile")
        if tracker is not None:
            tracker.log_trial_files(trial.number, {"": [recipe_path], "profile": profile, **files})
            tracker.log_trial_metrics(trial.number, metrics)
            ran = {"recipe": recipe.describe()} if parts.config.exports == "pareto" else {}  # the exports that ran
            tracker.set_trial_tags(trial.number, {"exported": "true", **ran})
    return recipes, notes


def front_files(recipes: dict[int, Path], best: Sequence[BestTrial]) -> list[str]:
    """The console's lines for the Pareto trials' folders, paretorch's best first (rank order): each trial's recipe
    and deployable files, full paths."""
    rank = {b.number: b.rank for b in best}
    lines = []
    for number, recipe in sorted(recipes.items(), key=lambda item: (rank.get(item[0], len(rank) + 1), item[0])):
        place = f" (best {rank[number]} of {len(rank)})" if number in rank else ""
        lines.append(f"Pareto trial {number}{place}: {recipe}")
        lines.extend(f"  {path}" for path in delivered(recipe.parent))
    return lines


def runtime_export(recipe: Recipe) -> StageConfig | None:
    """The export config that made the file ``recipe``'s runtime ran (OpenVINO's IR, ONNX Runtime's model), as
    the trial resolved it; None for a torch runtime."""
    exported = get_runtime(recipe.runtime).export
    if exported is None:
        return None
    return next((c for c in recipe.exports() if c.stage == exported.stage), None)


def export_trial(parts: StudyParts, record: TrialRecord,
                 folder: Path) -> tuple[Recipe, dict[str, list[Path]], dict[str, float], dict[str, str]]:
    """Run each export of a complete trial on its (cached) model and copy its files into ``folder`` (the trial's
    study folder); one failing export does not stop the others. Under an exported runtime (ONNX Runtime,
    OpenVINO), the file the trial measured is copied there too."""
    if record.recipe is None:
        raise ValueError(f"trial {record.number} has no recipe: only complete trials export")
    recipe, configs, runtime = record.recipe, record.configs, record.runtime
    export_nodes = parts.pipeline.export_nodes()
    files: dict[str, list[Path]] = {}
    metrics: dict[str, float] = {}
    status: dict[str, str] = {}
    resolved: list[StageConfig] = []
    for node in export_nodes:
        if configs.get(node.name) is None:
            continue
        only = {**configs, **{other.name: None for other in export_nodes if other.name != node.name}}
        try:
            result = parts.runner.run(only, runtime, exports=True, evaluate=False)
        except InfeasibleConfig as exc:
            status[node.name] = plain(f"infeasible: {exc.reason}")
            continue
        except Exception as exc:  # recorded on the trial's run; the other exports still run
            status[node.name] = plain(f"failed: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            continue
        export = result.nodes[node.name]
        status[node.name] = "ok"
        applied = export.resolved or export.config
        if applied is not None:
            resolved.append(applied)
        files[node.name] = companions(deliver(export.value, folder).path)
        for name, value in (result.export_evaluations.items()):
            for key, number in (value or {}).items():
                if isinstance(number, int | float) and not isinstance(number, bool):
                    metrics[f"{name}.{key}"] = float(number)
    try:
        measured = parts.runner.runtime_file(configs, runtime)
        if measured is not None and not (folder / Path(measured.path).name).exists():
            files[f"runtime.{runtime}"] = companions(deliver(measured, folder).path)
        if measured is not None:  # shipped: the exports column and the recipe name it (apply writes it too)
            ran = runtime_export(recipe)
            if ran is not None:
                status.setdefault(ran.stage, "ok")
                if all(c.stage != ran.stage for c in resolved):
                    resolved.append(ran)
    except Exception as exc:  # the file the trial ran came from the cache; whatever broke, the exports above stand
        status[f"runtime.{runtime}"] = plain(f"failed: {type(exc).__name__}: {exc}")
        traceback.print_exc()
    deployed = trial_deployment(parts, record, folder)
    if deployed is not None:
        files[DEPLOY_DIR], status[DEPLOY_DIR] = deployed
    final = Recipe(stages=(*recipe.model_stages(), *resolved), runtime=recipe.runtime, model=recipe.model,
                   metadata={**recipe.metadata, "exports": status})
    return final, files, metrics, status


def trial_deployment(parts: StudyParts, record: TrialRecord, folder: Path) -> tuple[list[Path], str] | None:
    """A front trial's ``deploy/`` folder (:mod:`paretorch.pipeline.engine.deployment`, from the trial's cached model,
    every recipe: its deploying stage's callable, else the model under its runtime): the files and "ok" or why it
    failed; None for a trial without a recipe."""
    if record.recipe is None:
        return None
    try:
        model = parts.runner.run(record.configs, record.runtime, exports=False, evaluate=False).model
        shipped = parts.runner.runtime_file(record.configs, record.runtime)
        save_deployment(model, record.recipe, folder / DEPLOY_DIR, shipped)
    except Exception as exc:  # recorded on the trial's run like a failed export; the exports stand
        traceback.print_exc()
        return [], plain(f"failed: {type(exc).__name__}: {exc}")
    return sorted((folder / DEPLOY_DIR).iterdir()), "ok"


def profile_calls(fn: Callable[..., Tensor], inputs: Batch, device: torch.device, folder: Path,
                  calls: int = 10, warmup: int = 3) -> list[Path]:
    """Profile ``calls`` forward calls after ``warmup``; write the trace and the table into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    with torch.no_grad():
        for _ in range(warmup):
            fn(*inputs)
        mps_profiler = getattr(getattr(torch, "mps", None), "profiler", None) if device.type == "mps" else None
        with torch_profile(activities=activities, record_shapes=True) as prof:
            if mps_profiler is not None:
                with mps_profiler.profile(mode="interval", wait_until_completed=True):
                    for _ in range(calls):
                        fn(*inputs)
            else:
                for _ in range(calls):
                    fn(*inputs)
    trace = folder / TRACE_FILE
    prof.export_chrome_trace(str(trace))
    table = folder / TABLE_FILE
    header = f"torch.profiler, {calls} calls on {device.type}, sorted by {sort_by}\n"
    table.write_text(header + (MPS_NOTE if device.type == "mps" else "")
                     + prof.key_averages().table(sort_by=sort_by, row_limit=25))
    return [trace, table]
