"""The study callback that prints one line per finished trial, moves the progress bar and writes
the trial's MLflow child run from its record (the one the trial objective handed back)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import optuna
from optuna.trial import FrozenTrial
from rich.console import Console
from rich.progress import Progress, TaskID

from paretorch.pipeline.core.device import describe
from paretorch.pipeline.core.input_agreement import describe as describe_inputs
from paretorch.pipeline.engine.short_recipe import short_recipe
from paretorch.pipeline.search.objectives import UNCERTAIN, drop_text, stored_interval
from paretorch.pipeline.search.pareto import best_trials
from paretorch.pipeline.search.plan import StudyParts
from paretorch.pipeline.search.probe import BEHIND_FRONT
from paretorch.pipeline.search.record import TrialRecord
from paretorch.pipeline.search.screening import SCREENED_OUT
from paretorch.pipeline.tracking.tracker import Tracker


class TrialLogger:
    """Study callback: logs each finished trial to MLflow and moves the progress bar."""

    def __init__(self, parts: StudyParts, tracker: Tracker | None, console: Console,
                 lock: Callable[[], contextlib.AbstractContextManager[object]] | None = None) -> None:
        self.parts = parts
        self.tracker = tracker
        #: The study's lock (:meth:`paretorch.pipeline.search.store.StudyStore.lock`), held while a trial's run is
        #: written: the catch-up of another process (:func:`paretorch.pipeline.search.loop.catch_up`, under the same
        #: lock) logs a finished trial no process logged, and without it both could write trial 2's run (two
        #: commands and two workers on digits once left two child runs of one trial).
        self.lock = lock or contextlib.nullcontext
        self.console = console
        self.device = describe(parts.device)
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.best = ""

    def __call__(self, study: optuna.Study, trial: FrozenTrial, record: TrialRecord) -> None:
        self.log(record)
        self._update_best(study)
        self.show(record)
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, advance=1 if record.counted else 0, best=self.best)

    def show(self, record: TrialRecord) -> None:
        """Print the trial's line: a terminal wraps it between words, a log file keeps it whole (one line per
        trial, to grep)."""
        self.console.print(self._line(record), soft_wrap=not self.console.is_terminal, highlight=False)

    def log(self, record: TrialRecord) -> None:
        """Write the trial's child run from its record, under the study's lock (:meth:`write`)."""
        if self.tracker is None or not record.counted:
            return
        with self.lock():
            self.write(record)

    def write(self, record: TrialRecord) -> None:
        """Write the trial's child run from its record, in one call (params = the resolved recipe), the study's
        lock held by the caller. A repeat gets no run: its recipe's numbers are on the original trial's run; nor does
        a ruled-out configuration (not a trial: the study's summary counts them)."""
        if self.tracker is None or not record.counted:
            return
        common = {"device": self.device, "sampler": self.parts.config.sampler}
        exports_ran = self.parts.config.exports == "every_trial"
        self.tracker.log_trial(record.number, record.state, record.params(),
                               record.tracking_metrics(self.parts.objectives.headline_keys()),
                               record.tracking_tags(common, exports_ran), record.start_ms, record.texts(),
                               name=record.run_name())

    def _update_best(self, study: optuna.Study) -> None:
        """The progress bar's note: the front's size, its lead (:func:`~.pareto.best_trials`)."""
        best = best_trials(study, self.parts.objectives)
        if not best:
            self.best = "no feasible trial yet"
            return
        lead = best[0].row
        self.best = (f"front {len(best)} | lead {lead.speedup:.2f}x at {self.parts.spec.metric.name} "
                     f"{lead.metric:.4f} (trial {lead.trial})")

    def _line(self, record: TrialRecord) -> str:
        return self._outcome(record) + (f" <- {record.seed}" if record.seed and record.repeat_of is None else "")

    def _outcome(self, record: TrialRecord) -> str:
        head = f"trial {record.number:3d} {record.state:8s}"
        if record.repeat_of is not None:
            return f"trial {record.number:3d} repeat of trial {record.repeat_of} (not run, not counted)"
        if record.ruled_out is not None:
            return f"trial {record.number:3d} ruled out: {record.ruled_out} (not run, not counted)"
        if record.state == "COMPLETE":
            values = record.metrics
            metric = self.parts.spec.metric.name
            unstable = f" | {record.latency_unstable} (off the front)" if record.latency_unstable else ""
            # Over the drop, under a fidelity floor, or a broken tail: the line says why it is off the front.
            infeasible = f" | infeasible: {record.reason()}" if record.feasible is False and record.over_drop else ""
            drop = drop_text(values.get("metric_drop", 0), stored_interval(values))
            uncertain = f" {UNCERTAIN}" if record.uncertain else ""
            inputs = f" | {text}" if (text := describe_inputs(values)) else ""
            return (f"{head} {metric} {values.get(metric, 0):.4f} (drop {drop}){uncertain}{inputs} | "
                    f"{speedup_text(values)} | {self._recipe(record)} [{record.seconds.get('trial', 0.0):.1f} s, "
                    f"{self._decided(record)}cache {record.cache.get('hits', 0)} hit(s)]{infeasible}{unstable}")
        asked = short_recipe(list(record.configs.values()), record.runtime)  # what it tried: the recipe it named
        if record.state == "PRUNED":
            if (record.infeasible or "").startswith(SCREENED_OUT):  # stopped at low fidelity, the full cost unpaid
                return f"{head} {asked} | {record.infeasible}"
            if (record.infeasible or "").startswith(BEHIND_FRONT):  # timed, far behind: not scored
                return f"{head} {asked} | {record.infeasible} [{record.seconds.get('trial', 0.0):.1f} s]"
            return f"{head} {asked} | infeasible: {record.infeasible or '?'}"
        return f"{head} {asked} | {(record.error or '?').strip().splitlines()[-1][:200]}"

    @staticmethod
    def _decided(record: TrialRecord) -> str:
        """``full evaluation, latency decided in 6 rounds, ``: what decided the trial (empty for older records)."""
        if record.fidelity is None:
            return ""
        rounds = int(record.metrics.get("latency_rounds", 0))
        early = " (stopped early)" if record.metrics.get("latency_stopped_early") else ""
        return f"{record.fidelity}, latency {rounds} rounds{early}, "

    def _recipe(self, record: TrialRecord) -> str:
        """The recipe that ran, short (:mod:`paretorch.pipeline.engine.short_recipe`; the full one: MLflow and the
        recipe file), with the exports where they ran with the trial (else they run at the end, for the front only)."""
        if record.recipe is None:
            return ""
        text = short_recipe(record.recipe.stages, record.recipe.runtime)
        if self.parts.config.exports == "every_trial" and (exports := record.recipe.exports()):
            text += " | -> " + ", ".join(c.stage.removeprefix("export.") for c in exports)
        return text


def speedup_text(metrics: Mapping[str, float]) -> str:
    """``2.41x [2.30, 2.52] paired``: a trial's speed-up as its line shows it (the table's number)."""
    text = f"{metrics.get('speedup', 0):.2f}x"
    if "speedup_ci_low" in metrics and "speedup_ci_high" in metrics:
        text += f" [{metrics['speedup_ci_low']:.2f}, {metrics['speedup_ci_high']:.2f}] paired"
    return text
