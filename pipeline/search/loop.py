"""The trial loop: progress, per-trial tracking, then Pareto exports and the study summary."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.progress import Progress, TextColumn
from rich.table import Table

from paretorch.pipeline.core.fidelity import FIDELITY_METRIC_NAMES, fidelity_note
from paretorch.pipeline.core.progress import progress_columns, say, sharing
from paretorch.pipeline.core.runtimes.registry import get_runtime
from paretorch.pipeline.search.advice import RunSettings, no_compression_advice
from paretorch.pipeline.search.compose import composed_note
from paretorch.pipeline.search.config import finished_states
from paretorch.pipeline.search.dashboard import note_study
from paretorch.pipeline.search.duplicates import TrialBudget
from paretorch.pipeline.search.finish import finish_study, study_dir, study_note
from paretorch.pipeline.search.front import Retimed, machine_line, retime_front
from paretorch.pipeline.search.interrupt import release, stopping
from paretorch.pipeline.search.objectives import (
    ATTR_EXPORTS,
    ATTR_RECIPE,
    Baseline,
    uncertain_note,
)
from paretorch.pipeline.search.pareto import (
    FRONT_NOTE,
    BestTrial,
    best_trials,
    pareto_rows,
    pareto_table,
    pareto_trials,
    table_columns,
)
from paretorch.pipeline.search.pareto_figure import pareto_figure_html, pareto_figure_png
from paretorch.pipeline.search.plan import StudyParts, StudyPlan
from paretorch.pipeline.search.proposals import Proposals
from paretorch.pipeline.search.quiet import stderr_to
from paretorch.pipeline.search.record import TrialRecord
from paretorch.pipeline.search.rule_out import summarize as summarize_ruled_out
from paretorch.pipeline.search.screening import screened_note
from paretorch.pipeline.search.storage import (
    ATTR_WORKER,
    fail_dead_trials,
    rerun_lines,
    retried,
    retry_trial,
    worker_id,
)
from paretorch.pipeline.search.store import Prepared, StudyStore
from paretorch.pipeline.search.study import Search
from paretorch.pipeline.search.time_to_result import (
    STUDY_START,
    ResultPoint,
    SearchTimes,
    best_so_far,
    completed_after,
    found_line,
    trials_seconds,
)
from paretorch.pipeline.search.trial_log import TrialLogger
from paretorch.pipeline.search.trial_objective import TrialObjective
from paretorch.pipeline.search.workers import Callback, run_trials
from paretorch.pipeline.tracking.columns import RANK_METRIC, SORT_METRIC
from paretorch.pipeline.tracking.tracker import Tracker

Launcher = Callable[[], tuple[bool, list[str]]]
#: The parent run's tag that says the metric is fidelity, which is conservative
#: (paretorch.pipeline.core.fidelity.fidelity_note).
FIDELITY_NOTE_TAG = "fidelity_note"


@dataclass
class SearchOutcome:
    """What ``optimize`` prints and tests read."""

    study: optuna.Study
    study_name: str
    baseline: Baseline
    pareto: list[FrozenTrial]
    table: Table
    recipes: dict[int, Path]
    times: SearchTimes
    cache: str
    parent_run_id: str | None
    tracking_uri: str | None
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    #: How noisy the machine was during the study (:func:`paretorch.pipeline.search.front.machine_line`).
    machine: str | None = None
    #: The best feasible speed-up against the study's wall time (:mod:`paretorch.pipeline.search.time_to_result`).
    results: list[ResultPoint] = field(default_factory=list)
    #: When the front's lead (paretorch's best trial) was found, in one line (None: an interrupted run).
    found: str | None = None
    #: paretorch's best trials, the table's order (:func:`~.pareto.best_trials`).
    best: list[BestTrial] = field(default_factory=list)


#: The per-study file that receives third-party warnings and progress bars (see :mod:`paretorch.pipeline.search.quiet`).
THIRD_PARTY_LOG = "third-party.log"


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
    log = study_dir(search.store.study_name) / THIRD_PARTY_LOG
    say(console, f"third-party warnings and progress bars: {log}")
    with stderr_to(log), stopping():
        return _run_search(search, trials, timeout, console, launch, started)


def _run_search(search: Search, trials: int, timeout: float | None, console: Console,
                launch: Launcher | None, started: float | None) -> SearchOutcome:
    wall_start = time.perf_counter() if started is None else started
    finished = finished_trials(search.store, trials)
    if finished is not None:
        console.print(f"study {search.store.study_name} has {finished} of {trials} trials; nothing to run"
                      + (f" (--trials {trials} is the study's total)" if finished > trials else ""), highlight=False)
    study, prepared, tracker = open_search(search, running=finished is None)
    try:
        return _searched(search, study, prepared, tracker, trials, timeout, console, launch, wall_start)
    except KeyboardInterrupt as exc:  # outside a trial (a front export, the re-measure): record, then stop
        release(exc)
        stop_recorded(study, tracker)
        raise


def _searched(search: Search, study: optuna.Study, prepared: Prepared, tracker: Tracker | None, trials: int,
              timeout: float | None, console: Console, launch: Launcher | None, wall_start: float) -> SearchOutcome:
    baseline, parts = prepared.baseline, search.model.parts()
    children = len(tracker.children) if tracker is not None else 0
    # The spec's caveat: what its built-in metric cannot judge.
    for line in (*prepared.lines(), parts.rules.unknown_line(), fidelity_note(parts.spec.metric), parts.spec.caveat):
        if line:
            say(console, line)
    parent = tracker.parent_run_id if tracker is not None else None
    logger = TrialLogger(parts, tracker, console, search.store.lock)
    console.print(f"allowed drop: {parts.objectives.describe_drop(baseline)}", highlight=False)
    say(console, parts.latency.describe(baseline.latency_ms, baseline.model_call_ms))
    done = catch_up(search.store, study, tracker, logger)
    budget = TrialBudget(trials, finished_states())
    remaining = trials - budget.counted(study)
    if remaining > 0:  # the interrupted or killed trials that run again first, and why
        for line in rerun_lines(study.get_trials(deepcopy=False)):
            say(console, line)
    interrupted = False
    notes: list[str] = []
    if remaining > 0 and launch is not None:
        interrupted, notes = launch()
        catch_up(search.store, study, tracker, logger)  # a worker that died left its trial RUNNING and unlogged
    elif remaining > 0:
        console.print(running_line(parts, trials, remaining, len(done), logger.device), highlight=False)
        interrupted = _run_here(search, study, prepared, budget, remaining, timeout, console, logger)
    if interrupted:
        return interrupted_outcome(parts, study, baseline, tracker, console, notes, parent)
    if tracker is not None:
        tracker.refresh_children()  # trials that other workers logged
    exported = export_outcomes(study)
    best = best_trials(study, parts.objectives)  # the one list every surface below names
    recipes, finish_notes = finish_study(parts, study, tracker, console, best)
    notes.extend(finish_notes)
    every = study.get_trials(deepcopy=False)
    notes.extend(end_notes(parts, study, every, baseline, trials))
    note_study(study, best, parts.objectives.describe_drop(baseline), parts.spec.metric.name)
    # Nothing ran and nothing was missing (a child run, an export): what the last run stored stays as it is.
    changed = remaining > 0 or export_outcomes(study) != exported or (
        tracker is not None and (tracker.created or len(tracker.children) != children))
    front = retime_front(parts, study, changed)
    total = budget.counted(study)
    title = f"{parts.spec.name}: Pareto front, {len(front.rows)} of {total} trials"
    table_notes = [f"device: {logger.device}", parts.latency.describe(), FRONT_NOTE, front.note]
    table = pareto_table(front.rows, parts.objectives, title, baseline, table_notes)
    times = spent(parts, time.perf_counter() - wall_start, prepared.start_seconds)
    results = best_so_far(every)
    if tracker is not None and changed:
        log_study(tracker, study, parts, baseline, front, best, total, "; ".join([title, *table_notes]),
                  times if remaining > 0 else None)  # the study's totals: a run that ran no trial adds nothing
        tracker.log_study_curve("time_to_result_speedup", [(p.seconds, p.speedup) for p in results])
    lead = best[0] if best else None
    found = found_line(results, lead, None if lead is None else completed_after(every, lead.number),
                       trials_seconds(every))
    return SearchOutcome(study, parts.study_name, baseline, pareto_trials(study), table, recipes, times,
                         parts.runner.cache.stats.describe(), parent, tracker.uri if tracker else None,
                         interrupted, notes, machine_line(study), results, found, best)


def end_notes(parts: StudyParts, study: optuna.Study, every: Sequence[FrozenTrial], baseline: Baseline,
              trials: int) -> list[str]:
    """The lines after a finished run's table (``every``: the study's trials): what was ruled out, composed, screened
    or uncertain, and what to try when no compression fit
    (:func:`~paretorch.pipeline.search.advice.no_compression_advice`)."""
    lines = [line for line in (summarize_ruled_out(study), composed_note(every), screened_note(every),
                               uncertain_note(every)) if line is not None]
    labelled = parts.spec.metric.name not in FIDELITY_METRIC_NAMES
    settings = RunSettings(parts.objectives.describe_drop(baseline), labelled, trials, parts.config.disabled)
    return lines + no_compression_advice(every, settings)


def running_line(parts: StudyParts, trials: int, remaining: int, done: int, device: str) -> str:
    """What runs now: the trials done (repeats, ruled-out and interrupted configurations not counted) and to run,
    on which device and runtimes, and when the exports run."""
    repeats = done - (trials - remaining)
    labels = ", ".join(get_runtime(r).label(parts.device) for r in parts.runtimes)
    return (f"study {parts.study_name}: {trials - remaining} trial(s) done"
            + (f" (and {repeats} repeat(s), ruled-out or interrupted configuration(s), not counted)" if repeats else "")
            + f", running {remaining} more on {device} (runtimes: {labels}); {exports_line(parts)}; full recipes: "
            f"MLflow param and tag 'recipe', Optuna attr '{ATTR_RECIPE}'")


def _run_here(search: Search, study: optuna.Study, prepared: Prepared, budget: TrialBudget, remaining: int,
              timeout: float | None, console: Console, logger: TrialLogger) -> bool:
    """This process runs the ``remaining`` trials under a progress bar; True if interrupted."""
    progress = Progress(*progress_columns(TextColumn("{task.fields[best]}")), console=console, transient=True,
                        redirect_stderr=False)  # standard error stays in the study's third-party log
    logger.progress, logger.task = progress, progress.add_task("trials", total=remaining, note="", best="")
    with progress, sharing(progress):  # a stage's long phase (distillation, calibration) is a row of this bar
        interrupted = trial_loop(search, study, prepared, budget, timeout, logger)
    if budget.exhausted:
        console.print(f"stopped early: the sampler proposed only repeats or ruled-out configurations "
                      f"({budget.consecutive} in a row)")
    return interrupted


def spent(parts: StudyParts, wall: float = 0.0, study_start: float = 0.0) -> SearchTimes:
    """Where this run's time went: the runner's tallies, with the paired latency rounds as evaluation, and the study
    start's own seconds (``study_start``: :attr:`Prepared.start_seconds`, where a run measured its start)."""
    by_category = dict(parts.runner.totals)
    by_category["evaluation"] += parts.latency.seconds
    if study_start:
        by_category[STUDY_START] = study_start
    return SearchTimes(wall, by_category)


def log_study(tracker: Tracker, study: optuna.Study, parts: StudyParts, baseline: Baseline, front: Retimed,
              best: Sequence[BestTrial], total: int, note: str, times: SearchTimes | None) -> None:
    """The study's parent run at the end: the front's table and plots, the summary metrics, this run's seconds
    added to the study's (``times``; None: none to add), its note, the trials' re-measured speed-ups; closed."""
    metrics = {"trials": float(total), "pareto_trials": float(len(front.rows)),
               **({"baseline_latency_ms_remeasured": front.baseline_ms} if front.speedups else {}),
               **{f"baseline_{k}": float(v) for k, v in vars(baseline).items() if isinstance(v, int | float)}}
    tracker.log_study_summary(table_columns(front.rows, parts.objectives),
                              {"pareto.png": pareto_figure_png(study, parts.objectives, baseline),
                               "pareto.html": pareto_figure_html(study, parts.objectives, baseline)},
                              metrics)
    if times is not None:
        tracker.add_study_seconds({"seconds_wall": times.wall,
                                   **{f"seconds_{k}": v for k, v in times.by_category.items()}})
    tracker.set_study_note(study_note(note, front.rows, parts, baseline, best))
    for number, speedup in front.speedups.items():
        tracker.log_trial_metrics(number, {"speedup_remeasured": speedup})
    tracker.close_study("FINISHED")


def interrupted_outcome(parts: StudyParts, study: optuna.Study, baseline: Baseline, tracker: Tracker | None,
                        console: Console, notes: list[str], parent: str | None) -> SearchOutcome:
    """Ctrl-C during the trials: what is done is in the study and MLflow already; the parent run is closed KILLED
    and nothing slow runs (no export, no re-measure): the next run of the study exports its front, and the
    interrupted trial's configuration runs again there (it is not counted)."""
    stop_recorded(study, tracker)
    total = TrialBudget(0, finished_states()).counted(study)
    exports = ", and the Pareto trials export then" if parts.config.exports == "pareto" else ""
    console.print(f"interrupted: {total} trial(s) recorded; the interrupted trial does not count and runs again "
                  f"when this command runs again{exports}", highlight=False)
    rows = pareto_rows(study, parts.objectives)
    title = f"{parts.spec.name}: Pareto front so far, {len(rows)} of {total} trials"
    table = pareto_table(rows, parts.objectives, title, baseline, [FRONT_NOTE, "re-timed: not yet (interrupted)"])
    return SearchOutcome(study, parts.study_name, baseline, pareto_trials(study), table, {}, spent(parts),
                         parts.runner.cache.stats.describe(), parent, tracker.uri if tracker else None,
                         True, notes, machine_line(study))


def stop_recorded(study: optuna.Study, tracker: Tracker | None) -> None:
    """After a Ctrl-C: no trial of this process left RUNNING (each is FAIL, its config enqueued again) and the
    study's MLflow parent run closed KILLED."""
    mine = worker_id()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if trial.user_attrs.get(ATTR_WORKER) == mine:
            retry_trial(study, trial.number)
    if tracker is not None:
        tracker.close_study("KILLED")


def catch_up(store: StudyStore, study: optuna.Study, tracker: Tracker | None,
             logger: TrialLogger) -> list[FrozenTrial]:
    """Mark FAIL the trials of dead workers and log the finished trials that no process logged; the
    finished trials."""
    with store.lock():
        fail_dead_trials(study)
        done = study.get_trials(deepcopy=False, states=finished_states())
        again = retried(study.get_trials(deepcopy=False))  # interrupted or killed: not a trial, its config runs again
        if tracker is not None:
            tracker.refresh_children()
            for trial in done:
                if trial.number not in tracker.children and trial.number not in again:
                    logger.write(TrialRecord.from_trial(trial))  # the lock held: the trial's own log waits
    return done


def finished_trials(store: StudyStore, trials: int) -> int | None:
    """The trials that count (as :class:`TrialBudget` counts them) of an existing study that has ``trials``
    of them already; None when there are trials to run."""
    if store.study_name not in store.study_names():
        return None
    counted = TrialBudget(trials, finished_states()).counted(store.open_study(create=False))
    return counted if counted >= trials else None


def export_outcomes(study: optuna.Study) -> dict[str, object]:
    """The stored export outcomes (:func:`~paretorch.pipeline.search.pareto.export_attr`): did a run add any?"""
    return {k: v for k, v in study.user_attrs.items() if k.startswith(f"{ATTR_EXPORTS}.")}


def exports_line(parts: StudyParts) -> str:
    """When the exports run (the trial lines name them only where they ran with the trial)."""
    names = ", ".join(n.op.removeprefix("export.") for n in parts.pipeline.export_nodes()) or "none"
    return {"pareto": f"exports ({names}) at the end, for the Pareto trials only",
            "every_trial": f"exports ({names}) with every trial"}.get(parts.config.exports, "no exports")


def open_search(search: Search, running: bool = True) -> tuple[optuna.Study, Prepared, Tracker | None]:
    """The tracker (an unreachable server fails first), the model (checked before any study exists),
    the study with its baseline and seeds, and the MLflow parent run: each get-or-create.
    ``running=False``: no trial will run, so the parent run's status is left as it is."""
    plan, store = search.plan, search.store
    tracker = Tracker(store.tracking_uri) if store.track else None
    runner = search.model.runner
    began, tallied = time.perf_counter(), sum(runner.totals.values())
    study, prepared = search.prepare()
    # The start's own seconds (the reference pass, self-check, noise floor, probe); the baseline's run is the runner's.
    own = time.perf_counter() - began - (sum(runner.totals.values()) - tallied)
    prepared = replace(prepared, start_seconds=max(0.0, own))
    baseline = prepared.baseline
    if tracker is not None:
        with store.lock():  # two processes starting together: one parent run (its own-run check alone raced)
            open_parent(plan, store, tracker, baseline, running)
        tracker.show_columns(plan.objectives.headline_keys(),
                             leading=(RANK_METRIC, SORT_METRIC, plan.spec.metric.name, "metric_drop"))
    return study, prepared, tracker


def open_parent(plan: StudyPlan, store: StudyStore, tracker: Tracker, baseline: Baseline, running: bool) -> None:
    """Find or create the study's MLflow parent run, with the search's params and tags."""
    tracker.open_study(
        plan.spec.name, store.study_name,
        params={**{"search." + k: v for k, v in plan.config.model_dump(mode="json").items() if k != "seeds"},
                "search.runtimes": list(plan.runtimes),  # those the device offered, not every one the config names
                **plan.objectives.drop_params(baseline)},
        tags={"storage": store.label, "pipeline": plan.pipeline.describe(),
              **({FIDELITY_NOTE_TAG: note} if (note := fidelity_note(plan.spec.metric)) else {})},
        running=running,
    )


def run_worker(search: Search, trials: int, timeout: float | None = None, console: Console | None = None) -> bool:
    """One worker of a study that another process prepared (``--workers N``): run and log trials until the
    study has ``trials``; True if interrupted. The preparing process exports and logs the front."""
    study, prepared, tracker = open_search(search)
    logger = TrialLogger(search.model.parts(), tracker, console or Console(), search.store.lock)
    with stopping():
        return trial_loop(search, study, prepared, TrialBudget(trials, finished_states()), timeout, logger)


def trial_loop(search: Search, study: optuna.Study, prepared: Prepared, budget: TrialBudget, timeout: float | None,
               logger: Callback) -> bool:
    """Run this process's trials (:func:`~paretorch.pipeline.search.workers.run_trials`): the trial objective, and after
    each trial its line and MLflow run (``logger``) then the search's own proposals; True if interrupted."""
    objective, proposals = trial_parts(search, prepared)
    return run_trials(objective, search.store.lock(), study, budget, timeout, [logger, proposals])


def trial_parts(search: Search, prepared: Prepared) -> tuple[TrialObjective, Proposals]:
    """The study's trial objective and the proposals made after each trial (the runtime sweep, compositions): each
    receives the values and ports it uses (the study's parts, its plan, the seeder, the index of measured recipes)."""
    objective = TrialObjective(search.model.parts(), prepared.baseline)
    proposals = Proposals(search.plan, prepared.baseline, search.seeder(prepared.machine), objective.repeats)
    return objective, proposals
