"""The trial loop: progress, per-trial tracking, then Pareto exports and the study summary."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from rich.console import Console
from rich.progress import Progress, TextColumn
from rich.table import Table

from pipeline.core.errors import InfeasibleConfig
from pipeline.core.fidelity import fidelity_note
from pipeline.core.paths import results_dir
from pipeline.core.progress import phase, progress_columns, sharing
from pipeline.core.secrets import mask_secrets
from pipeline.core.stage import StageConfig
from pipeline.core.text import plain
from pipeline.engine.recipe import Recipe
from pipeline.search.config import finished_states
from pipeline.search.dashboard import note_study
from pipeline.search.duplicates import TrialBudget
from pipeline.search.explain import dominated_by, front_tags
from pipeline.search.front import (
    BASELINE,
    ROUNDS,
    front_candidates,
    machine_line,
    remeasure,
    remeasured_speedups,
    with_remeasured,
)
from pipeline.search.objectives import (
    ATTR_DOMINATED_BY,
    ATTR_EXPORTS,
    ATTR_RECIPE,
    ATTR_REMEASURED,
    Baseline,
)
from pipeline.search.pareto import (
    FRONT_NOTE,
    distinct_front,
    export_attr,
    pareto_figure_html,
    pareto_figure_png,
    pareto_rows,
    pareto_table,
    pareto_trials,
    table_columns,
)
from pipeline.search.profile import profile_calls
from pipeline.search.quiet import stderr_to
from pipeline.search.record import TrialRecord
from pipeline.search.storage import fail_dead_trials
from pipeline.search.study import Search, SearchTimes
from pipeline.search.trial_log import TrialLogger
from pipeline.search.workers import run_trials
from pipeline.tracking.tracker import Tracker
from pipeline.tracking.views import NOTE_TAG, markdown_table

Launcher = Callable[[], tuple[bool, list[str]]]
#: The parent run's tag that says the metric is fidelity, which is conservative (pipeline.core.fidelity.fidelity_note).
FIDELITY_NOTE_TAG = "fidelity_note"


@dataclass
class SearchOutcome:
    """What ``optimize`` prints and tests read."""

    study: Any
    study_name: str
    baseline: Baseline
    pareto: list[Any]
    table: Table
    recipes: dict[int, Path]
    times: SearchTimes
    cache: str
    parent_run_id: str | None
    tracking_uri: str | None
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    #: How noisy the machine was during the study (:func:`pipeline.search.front.machine_line`).
    machine: str | None = None


#: The per-study file that receives third-party warnings and progress bars (see :mod:`pipeline.search.quiet`).
THIRD_PARTY_LOG = "third-party.log"


def study_dir(name: str) -> Path:
    """``<results>/studies/<study>``: recipes of the Pareto trials."""
    path = results_dir() / "studies" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_search(search: Search, trials: int, timeout: float | None = None,
               console: Console | None = None, launch: Launcher | None = None,
               started: float | None = None) -> SearchOutcome:
    """Run ``search``'s study up to ``trials`` finished trials (repeats not counted), export and log
    the Pareto front; third-party output goes to the study's log file (its path is printed).

    ``launch``: this process prepares the study, ``launch()`` runs the trials in worker processes,
    then this process exports and logs the front (the workers call :func:`run_worker`).

    ``started``: ``time.perf_counter()`` when the command started (the wall time covers it all); default now.
    A study that has its ``trials`` already runs nothing, says so at once and changes nothing that was right:
    no trial, no wall time, no re-measure (the stored one is shown), no MLflow write unless something was
    missing (a child run, an export)."""
    console = console or Console()
    log = study_dir(search.study_name) / THIRD_PARTY_LOG
    console.print(f"third-party warnings and progress bars: {log}", highlight=False, soft_wrap=True)
    with stderr_to(log):
        return _run_search(search, trials, timeout, console, launch, started)


def _run_search(search: Search, trials: int, timeout: float | None, console: Console,
                launch: Launcher | None, started: float | None) -> SearchOutcome:
    wall_start = time.perf_counter() if started is None else started
    finished = finished_trials(search, trials)
    if finished is not None:
        console.print(f"study {search.study_name} has {finished} of {trials} trials; nothing to run"
                      + (f" (--trials {trials} is the study's total)" if finished > trials else ""), highlight=False)
    study, baseline, tracker = open_search(search, running=finished is None)
    children = len(tracker.children) if tracker is not None else 0
    if search.self_check_line:
        console.print(search.self_check_line, highlight=False, soft_wrap=True)
    if fidelity := fidelity_note(search.spec.metric):
        console.print(fidelity, highlight=False, soft_wrap=True)
    parent = tracker.parent_run_id if tracker is not None else None
    logger = TrialLogger(search, tracker, console)
    console.print(f"allowed drop: {search.objectives.describe_drop(baseline)}", highlight=False)
    done = catch_up(search, study, tracker, logger)
    budget = TrialBudget(trials, finished_states())
    remaining = trials - budget.counted(study)
    interrupted = False
    notes: list[str] = []
    if remaining > 0 and launch is not None:
        interrupted, notes = launch()
        catch_up(search, study, tracker, logger)  # a worker that died left its trial RUNNING and unlogged
    elif remaining > 0:
        repeats = len(done) - (trials - remaining)
        console.print(f"study {search.study_name}: {trials - remaining} trial(s) done"
                      + (f" (and {repeats} repeat(s) of measured recipes, not counted)" if repeats else "")
                      + f", running {remaining} more on {logger.device} (runtimes: {', '.join(search.runtimes)}); "
                      f"{exports_line(search)}; full recipes: MLflow param and tag 'recipe', Optuna attr "
                      f"'{ATTR_RECIPE}'", highlight=False)
        progress = Progress(*progress_columns(TextColumn("{task.fields[best]}")), console=console, transient=True,
                            redirect_stderr=False)  # standard error stays in the study's third-party log
        logger.progress, logger.task = progress, progress.add_task("trials", total=remaining, note="", best="")
        with progress, sharing(progress):  # a stage's long phase (distillation, calibration) is a row of this bar
            interrupted = run_trials(search, study, budget, timeout, [logger, search.sweep_runtimes, budget])
        if budget.exhausted:
            console.print(f"stopped early: the sampler proposed only repeats of measured recipes "
                          f"({budget.consecutive} in a row)")
    if interrupted:
        console.print("interrupted: exporting and logging what is done")
    if tracker is not None:
        tracker.refresh_children()  # trials that other workers logged
    exported = export_outcomes(study)
    recipes, finish_notes = finish_study(search, study, tracker, console)
    notes.extend(finish_notes)
    note_study(study, [t.number for t, _ in distinct_front(study)], search.objectives.describe_drop(baseline))
    # Nothing ran and nothing was missing (a child run, an export): what the last run stored stays as it is.
    changed = remaining > 0 or export_outcomes(study) != exported or (
        tracker is not None and (tracker.created or len(tracker.children) != children))
    rows = pareto_rows(study, search.objectives)
    front = [t for t, _ in distinct_front(study)]
    stored = study.user_attrs.get(ATTR_REMEASURED, {})
    again: dict[int, float] = {}
    remeasured = "re-measured: when the study's trials last ran (stored; nothing ran since)"
    if changed or not all(str(t.number) in stored for t in front):
        with phase(f"re-measuring the front for the table: {len(front)} trial(s) and the unoptimized model, "
                   f"interleaved, {ROUNDS} rounds"):
            measured = remeasure(search, front_candidates(search, front))
        rows = with_remeasured(rows, measured)
        again = remeasured_speedups(measured)
        study.set_user_attr(ATTR_REMEASURED, {str(k): v for k, v in again.items()})
        remeasured = (f"re-measured: the front again with the baseline ({measured[BASELINE].latency_ms:.3f} ms), "
                      f"interleaved, {ROUNDS} rounds")
    total = budget.counted(study)
    title = (f"{search.spec.name}: Pareto front, {len(rows)} of {total} trials ({logger.device}); {FRONT_NOTE}; "
             f"{remeasured}")
    table = pareto_table(rows, search.objectives, title, baseline)
    search.times.by_category = dict(search.runner.totals)
    search.times.wall = time.perf_counter() - wall_start
    if tracker is not None and changed:
        metrics = {"trials": float(total), "pareto_trials": float(len(rows)),
                   **({"baseline_latency_ms_remeasured": measured[BASELINE].latency_ms} if again else {}),
                   **{f"baseline_{k}": float(v) for k, v in vars(baseline).items() if isinstance(v, int | float)}}
        tracker.log_study_summary(table_columns(rows, search.objectives),
                                  {"pareto.png": pareto_figure_png(study, search.objectives, baseline),
                                   "pareto.html": pareto_figure_html(study, search.objectives, baseline)},
                                  metrics)
        if remaining > 0:  # the study's totals over all its runs; a run that ran no trial adds nothing
            tracker.add_study_seconds({"seconds_wall": search.times.wall,
                                       **{f"seconds_{k}": v for k, v in search.times.by_category.items()}})
        tracker.client.set_tag(tracker.parent_run_id, NOTE_TAG, study_note(title, rows, search, baseline))
        for number, speedup in again.items():
            tracker.log_trial_metrics(number, {"speedup_remeasured": speedup})
        tracker.close_study("KILLED" if interrupted else "FINISHED")
    return SearchOutcome(study, search.study_name, baseline, pareto_trials(study), table, recipes, search.times,
                         search.runner.cache.stats.describe(), parent, tracker.uri if tracker else None,
                         interrupted, notes, machine_line(study))


def catch_up(search: Search, study: optuna.Study, tracker: Tracker | None,
             logger: TrialLogger) -> list[FrozenTrial]:
    """Mark FAIL the trials of dead workers and log the finished trials that no process logged; the
    finished trials."""
    with search.lock():
        fail_dead_trials(study)
        done = study.get_trials(deepcopy=False, states=finished_states())
        if tracker is not None:
            tracker.refresh_children()
            for trial in done:
                if trial.number not in tracker.children:
                    logger.log(trial)
    return done


def finished_trials(search: Search, trials: int) -> int | None:
    """The trials that count (as :class:`TrialBudget` counts them) of an existing study that has ``trials``
    of them already; None when there are trials to run."""
    if search.study_name not in search.study_names():
        return None
    counted = TrialBudget(trials, finished_states()).counted(search.open_study(create=False))
    return counted if counted >= trials else None


def export_outcomes(study: optuna.Study) -> dict[str, Any]:
    """The stored export outcomes (:func:`~pipeline.search.pareto.export_attr`): did a run add any?"""
    return {k: v for k, v in study.user_attrs.items() if k.startswith(f"{ATTR_EXPORTS}.")}


def exports_line(search: Search) -> str:
    """When the exports run (the trial lines name them only where they ran with the trial)."""
    names = ", ".join(n.op.removeprefix("export.") for n in search.pipeline.export_nodes()) or "none"
    return {"pareto": f"exports ({names}) at the end, for the Pareto trials only",
            "every_trial": f"exports ({names}) with every trial"}.get(search.config.exports, "no exports")


def open_search(search: Search, running: bool = True) -> tuple[optuna.Study, Baseline, Tracker | None]:
    """The tracker (an unreachable server fails first), the model (checked before any study exists),
    the study with its baseline and seeds, and the MLflow parent run: each get-or-create.
    ``running=False``: no trial will run, so the parent run's status is left as it is."""
    tracker = Tracker(search.tracking_uri) if search.track else None
    search.runner  # noqa: B018
    study = search.open_study()
    baseline = search.ensure_baseline(study)
    if tracker is not None:
        tracker.open_study(
            search.spec.name, search.study_name,
            params={**{"search." + k: v for k, v in search.config.model_dump(mode="json").items() if k != "seeds"},
                    **search.objectives.drop_params(baseline)},
            tags={"storage": mask_secrets(search.storage), "pipeline": search.pipeline.describe(),
                  **({FIDELITY_NOTE_TAG: note} if (note := fidelity_note(search.spec.metric)) else {})},
            running=running,
        )
        tracker.show_columns(search.objectives.headline_keys())
    return study, baseline, tracker


def run_worker(search: Search, trials: int, timeout: float | None = None, console: Console | None = None) -> bool:
    """One worker of a study that another process prepared (``--workers N``): run and log trials until the
    study has ``trials``; True if interrupted. The preparing process exports and logs the front."""
    study, _baseline, tracker = open_search(search)
    logger = TrialLogger(search, tracker, console or Console())
    budget = TrialBudget(trials, finished_states())
    return run_trials(search, study, budget, timeout, [logger, search.sweep_runtimes, budget])


def study_note(title: str, rows: list[Any], search: Search, baseline: Baseline) -> str:
    """The parent run's Description: the Pareto table and where to look next."""
    columns = table_columns(rows, search.objectives)
    columns.pop("exports", None)
    return (f"**{title}**\n\n{markdown_table(columns)}\n\n"
            f"Plot: Artifacts > pareto.png (interactive: pareto.html). Every trial run is tagged `feasible`; "
            f"`reason` says why a trial is infeasible, over the allowed drop "
            f"({search.objectives.describe_drop(baseline)}) or failed; `dominated_by` names the front trial that "
            f"beats it. Headline metrics are top-level, "
            f"the rest under `detail.`.")


def finish_study(search: Search, study: optuna.Study, tracker: Tracker | None,
                 console: Console) -> tuple[dict[int, Path], list[str]]:
    """Export the Pareto trials (unless done before), save their recipes, tag them in MLflow."""
    distinct = distinct_front(study)
    dominated = dominated_by(study, pareto_trials(study))
    study.set_user_attr(ATTR_DOMINATED_BY, {str(k): v for k, v in dominated.items()})
    notes: list[str] = []
    if tracker is not None:
        tags = front_tags(study, distinct, dominated)
        for number in tracker.children:
            tracker.set_trial_tags(number, tags.get(number, {"pareto": "false"}))
    recipes: dict[int, Path] = {}
    for trial, _repeats in distinct:
        folder = study_dir(search.study_name) / f"trial-{trial.number:03d}"
        recipe_path = folder / "recipe.json"
        already = export_attr(trial.number) in study.user_attrs and recipe_path.is_file()
        if already and (tracker is None or tracker.trial_tags(trial.number).get("exported") == "true"):
            recipes[trial.number] = recipe_path
            continue
        record = search.record(trial)
        if record.recipe is None:
            continue
        recipe = record.recipe
        files: dict[str, list[Path]] = {}
        metrics: dict[str, float] = {}
        if search.config.exports == "pareto":
            console.print(f"exporting Pareto trial {trial.number}: {recipe.describe()}")
            recipe, files, metrics, status = export_trial(search, record)
            study.set_user_attr(export_attr(trial.number), status)
            notes.extend(f"trial {trial.number} {k}: {v}" for k, v in status.items() if v != "ok")
        elif export_attr(trial.number) not in study.user_attrs:
            study.set_user_attr(export_attr(trial.number), {})
        recipes[trial.number] = recipe.save(recipe_path)
        profile = profile_calls(search.latency.function(record.configs, record.runtime), search.latency.inputs(),
                                search.device, folder / "profile")
        if tracker is not None:
            tracker.log_trial_files(trial.number, {"": [recipe_path], "profile": profile, **files})
            tracker.log_trial_metrics(trial.number, metrics)
            tracker.set_trial_tags(trial.number, {"exported": "true"})
    return recipes, notes


def export_trial(search: Search,
                 record: TrialRecord) -> tuple[Recipe, dict[str, list[Path]], dict[str, float], dict[str, str]]:
    """Run each export of a complete trial on its (cached) model; one failing export does not stop the others."""
    if record.recipe is None:
        raise ValueError(f"trial {record.number} has no recipe: only complete trials export")
    recipe, configs, runtime = record.recipe, record.configs, record.runtime
    export_nodes = search.pipeline.export_nodes()
    files: dict[str, list[Path]] = {}
    metrics: dict[str, float] = {}
    status: dict[str, str] = {}
    resolved: list[StageConfig] = []
    for node in export_nodes:
        if configs.get(node.name) is None:
            continue
        only = {**configs, **{other.name: None for other in export_nodes if other.name != node.name}}
        try:
            result = search.runner.run(only, runtime, exports=True, evaluate=False)
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
        entry = search.runner.cache.export_dir / export.key if search.runner.cache.export_dir else Path(".")
        files[node.name] = sorted(p for p in entry.iterdir() if p.name != "manifest.json")
        for name, value in (result.export_evaluations.items()):
            for key, number in (value or {}).items():
                if isinstance(number, int | float) and not isinstance(number, bool):
                    metrics[f"{name}.{key}"] = float(number)
    final = Recipe(stages=(*recipe.model_stages(), *resolved), runtime=recipe.runtime, model=recipe.model,
                   metadata={**recipe.metadata, "exports": status})
    return final, files, metrics, status
