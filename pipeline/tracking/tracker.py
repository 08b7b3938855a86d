"""MLflow tracking through ``MlflowClient`` with explicit run ids (no global active run).

* one experiment per model spec (``paretorch/<spec>``);
* one parent run per Optuna study (tag ``paretorch.study``); a resumed study keeps
  logging under the same parent;
* one child run per trial (tag ``paretorch.trial``): params = the flattened
  per-node configs, metrics = the trial's measurements, tags = device, library
  versions, trial state, ``outcome``, ``pareto``, the infeasibility reason; its status is
  FINISHED for a complete trial, KILLED (MLflow's "stopped before its end") for a pruned one
  (stopped by the latency probe, screened out, a configuration that cannot run: its ``outcome``
  tag says why), FAILED for a failed one; the front's leads carry their rank
  (:meth:`Tracker.set_trial_ranks`), which the runs view sorts by;
* Pareto trials carry their recipe JSON and exported files as artifacts;
* the parent carries the Pareto table (``log_table``) and the Pareto plot (PNG and HTML).

Default store: SQLite in the results directory (``<results>/mlflow.db``, artifacts
under ``<results>/mlartifacts``), the store ``make ui`` serves. Its experiments keep their
artifacts at ``mlflow-artifacts:/<experiment folder>`` (``paretorch.pipeline.tracking.artifacts``), so a
moved or copied results folder shows its own files.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from paretorch.pipeline.core.errors import PipelineError
from paretorch.pipeline.core.locks import file_lock
from paretorch.pipeline.core.paths import results_dir, sqlite_file
from paretorch.pipeline.core.secrets import mask_secrets
from paretorch.pipeline.core.writable import check_writable_dir
from paretorch.pipeline.tracking.artifacts import artifact_root_for, experiment_location, registered
from paretorch.pipeline.tracking.columns import KEY_TAGS, VIEW_TAG, headline_view

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from mlflow import MlflowClient
    from mlflow.entities import Run
    from plotly.graph_objects import Figure as PlotlyFigure

TRACKED_LIBRARIES = ("torch", "torchao", "torch-pruning", "coremltools", "onnx", "onnxruntime", "optuna", "mlflow")
STUDY_TAG = "paretorch.study"
ROLE_TAG = "paretorch.role"
TRIAL_TAG = "paretorch.trial"
PARENT_TAG = "mlflow.parentRunId"
#: The run tag MLflow renders as the run's Description (Markdown).
NOTE_TAG = "mlflow.note.content"
#: Seconds to wait for an MLflow server's ``/health`` before giving up.
SERVER_TIMEOUT_S = 10.0
_INVALID_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")
#: Metrics logged to 4 significant digits: latencies and seconds, whose further digits are timing noise.
#: The MLflow UI has no display precision setting (mlflow/mlflow#17150, #3693): it shows what is logged.
#: Task metrics, drops, speed-ups and sizes are logged as measured (the table's numbers, rounded there).
_DISPLAY_ROUNDED = re.compile(r"(^|[._])(latency|seconds)|_ms(_|$)")
DISPLAY_DIGITS = 4
#: A child run's MLflow status per Optuna trial state (any other: FAILED). MLflow has no "pruned": KILLED is its
#: status for a run stopped before its end, and the run's ``outcome`` tag says why.
RUN_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}


def default_tracking_uri() -> str:
    """``sqlite:///<results>/mlflow.db``."""
    return f"sqlite:///{results_dir() / 'mlflow.db'}"


def check_server(uri: str, timeout: float = SERVER_TIMEOUT_S) -> None:
    """Raise one :class:`PipelineError` unless the MLflow server at ``uri`` answers ``/health`` within ``timeout``
    (MLflow's own client retries for minutes before it gives up)."""
    parts = urllib.parse.urlsplit(uri)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    health = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
    request = urllib.request.Request(health)
    if parts.username is not None:
        token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            answer.read(64)
    except (OSError, ValueError) as exc:  # refused, timed out, DNS, HTTP error status
        reason = getattr(exc, "reason", None) or exc
        raise PipelineError(mask_secrets(
            f"the MLflow server {uri} does not answer ({reason}): start it (mlflow server --host ... --port ...), "
            "fix --tracking-uri, or pass --no-tracking")) from exc


def experiment_name(spec_name: str) -> str:
    return f"paretorch/{spec_name}"


def library_tags() -> dict[str, str]:
    tags = {}
    for name in TRACKED_LIBRARIES:
        try:
            tags[f"version.{name}"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            tags[f"version.{name}"] = "not installed"
    return tags


def display_value(key: str, value: float) -> float:
    """``value`` as logged under ``key``: latencies and seconds to :data:`DISPLAY_DIGITS` significant digits."""
    value = float(value)
    if _DISPLAY_ROUNDED.search(key) and math.isfinite(value):
        return float(f"{value:.{DISPLAY_DIGITS}g}")
    return value


def clean_key(key: str) -> str:
    """An MLflow-safe param/metric/tag name (``prune#2.ratio`` -> ``prune_2.ratio``)."""
    return _INVALID_KEY_CHARS.sub("_", key)


class Tracker:
    """Logs one study and its trials to MLflow; every call names its run id explicitly. The only code
    that talks to MLflow's client (kept private)."""

    def __init__(self, tracking_uri: str | None = None) -> None:
        from mlflow import MlflowClient

        # MLflow's SQLite store logs schema migrations at INFO on first use.
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        # MLflow prints "View run ... at: <tracking URI>" (with any password in it) when a run ends.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        self.uri = tracking_uri or default_tracking_uri()
        self.artifact_root = artifact_root_for(self.uri)
        if self.uri.startswith(("http://", "https://")):
            check_server(self.uri)
        elif self.artifact_root is not None:
            check_writable_dir(self.artifact_root.parent, "the MLflow store's directory",
                               "--tracking-uri or --results-dir")
            if not registered():
                raise PipelineError("the installed paretorch predates its MLflow artifact entry point "
                                    "(pyproject.toml): reinstall it (make setup, or pip install -e .)")
        database = sqlite_file(self.uri)
        lock = file_lock(database.with_name(f"{database.name}.lock")) if database else contextlib.nullcontext()
        try:
            with lock:  # a local store's schema is created or migrated on first use: not safe to race
                self._client: MlflowClient = MlflowClient(tracking_uri=self.uri)
                self._client.search_experiments(max_results=1)
        except Exception as exc:
            raise PipelineError(mask_secrets(f"cannot open the MLflow store {self.uri}: {type(exc).__name__}: {exc}")) \
                from exc
        self.experiment_id = ""
        self.parent_run_id = ""
        self.children: dict[int, str] = {}
        self.study_name = ""
        #: This process created the study's parent run (it had none).
        self.created = False

    # ------------------------------------------------------------------ study (parent run)

    def open_study(self, spec_name: str, study_name: str, params: Mapping[str, object], tags: Mapping[str, str],
                   running: bool = True) -> str:
        """Find or create the experiment and the study's parent run; returns the parent run id.
        ``running=False``: no trial will run, so an existing parent run keeps its status and end time."""
        self.study_name = study_name
        name = experiment_name(spec_name)
        self.experiment_id = self._get_or_create_experiment(name)
        parents = self._parents(study_name)
        if parents:
            self.parent_run_id = parents[0].info.run_id
            if running:
                self._client.update_run(self.parent_run_id, status="RUNNING")
            self._load_children()
            return self.parent_run_id
        run = self._client.create_run(
            self.experiment_id,
            run_name=study_name,
            tags={STUDY_TAG: study_name, ROLE_TAG: "study", **library_tags(), **tags},
        )
        # Two processes that started together may both have created a parent: the oldest one wins.
        oldest = self._parents(study_name)[0].info.run_id
        if oldest != run.info.run_id:
            self._client.delete_run(run.info.run_id)
            self.parent_run_id = oldest
            self._load_children()
            return oldest
        self.parent_run_id = run.info.run_id
        self.created = True
        self._log(self.parent_run_id, params=params)
        return self.parent_run_id

    def show_columns(self, metrics: Sequence[str], tags: Sequence[str] = KEY_TAGS, leading: Sequence[str] = ()) -> None:
        """Add these metrics and run tags to the columns the experiment's runs table opens with
        (``paretorch.pipeline.tracking.columns``; the URL ``make ui`` prints): the trial runs, one row each; the
        ``leading`` metrics, then the tags, first."""
        current = self._client.get_experiment(self.experiment_id).tags.get(VIEW_TAG)
        view = headline_view([clean_key(m) for m in metrics], [clean_key(t) for t in tags], current,
                             search_filter=f"tags.`{ROLE_TAG}` = 'trial'", leading=[clean_key(m) for m in leading])
        if view != current:
            self._client.set_experiment_tag(self.experiment_id, VIEW_TAG, view)

    def _get_or_create_experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self._client.get_experiment_by_name(name)
        if experiment is not None:
            return str(experiment.experiment_id)
        location = None
        if self.artifact_root is not None:
            location = experiment_location(clean_key(name).replace("/", "-"))
        try:
            return str(self._client.create_experiment(name, artifact_location=location))
        except MlflowException:  # another worker created it first
            experiment = self._client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return str(experiment.experiment_id)

    def _parents(self, study_name: str) -> list[Run]:
        """The study's parent runs, oldest first."""
        return list(self._client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{STUDY_TAG}` = '{study_name}' and tags.`{ROLE_TAG}` = 'study'",
            order_by=["attributes.start_time ASC"],
            max_results=10,
        ))

    def refresh_children(self) -> None:
        """Read back the child runs that other workers of the study logged."""
        if self.parent_run_id:
            self._load_children()

    def _load_children(self) -> None:
        page_token = None
        while True:
            page = self._client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_run_id}'",
                max_results=1000,
                page_token=page_token,
            )
            for run in page:
                number = run.data.tags.get(TRIAL_TAG)
                if number is not None:
                    self.children[int(number)] = run.info.run_id
            page_token = page.token
            if not page_token:
                break

    def set_study_note(self, text: str) -> None:
        """The parent run's Description (Markdown) in the MLflow UI."""
        if self.parent_run_id:
            self._client.set_tag(self.parent_run_id, NOTE_TAG, text)

    def close_study(self, status: str = "FINISHED") -> None:
        if self.parent_run_id:
            self._client.set_terminated(self.parent_run_id, status=status)

    # ------------------------------------------------------------------ trials (child runs)

    def log_trial(
        self,
        number: int,
        state: str,
        params: Mapping[str, object],
        metrics: Mapping[str, float],
        tags: Mapping[str, str],
        start_ms: int | None = None,
        texts: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> str:
        """Create (once) the child run of trial ``number`` and log everything about it; ``name``: the run's name
        (default ``trial-NNN``)."""
        if number in self.children:
            return self.children[number]
        self._load_children()  # another worker may have logged it
        if number in self.children:
            return self.children[number]
        run = self._client.create_run(
            self.experiment_id,
            start_time=start_ms,
            run_name=name or f"trial-{number:03d}",
            tags={PARENT_TAG: self.parent_run_id, STUDY_TAG: self.study_name, ROLE_TAG: "trial",
                  TRIAL_TAG: str(number), "state": state, **library_tags(), **tags},
        )
        run_id = run.info.run_id
        self._log(run_id, params=params, metrics=metrics)
        for artifact_file, text in (texts or {}).items():
            self._client.log_text(run_id, text, artifact_file)
        status = RUN_STATUS.get(state, "FAILED")
        self._client.set_terminated(run_id, status=status)
        self.children[number] = run_id
        return run_id

    def set_trial_ranks(self, key: str, ranks: Mapping[int, int]) -> None:
        """Log each ranked trial's rank as the metric ``key`` (trial number -> rank); a trial ranked before (a
        resumed study) that no longer is gets NaN (MLflow deletes no metric; the UI sorts NaN after every rank)."""
        if not self.parent_run_id:
            return
        ranked = {self.children[n]: float(r) for n, r in ranks.items() if n in self.children}
        before = self._client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_run_id}' and "
                                                f"metrics.`{clean_key(key)}` > 0", max_results=1000)
        for run_id in {r.info.run_id for r in before} - set(ranked):
            self._log(run_id, metrics={key: math.nan})
        for run_id, rank in ranked.items():
            self._log(run_id, metrics={key: rank})

    def set_trial_tags(self, number: int, tags: Mapping[str, str]) -> None:
        if number in self.children:
            self._log(self.children[number], tags=tags)

    def trial_tags(self, number: int) -> dict[str, str]:
        if number not in self.children:
            return {}
        return dict(self._client.get_run(self.children[number]).data.tags)

    def log_trial_files(self, number: int, files: Mapping[str, Sequence[Path]]) -> None:
        """Attach files and directories (e.g. a ``.mlpackage``) to a trial's run:
        ``{artifact dir ("" = root): [local paths]}``."""
        if number not in self.children:
            self._load_children()
        run_id = self.children.get(number)
        if run_id is None:
            return
        for artifact_path, paths in files.items():
            for path in paths:
                if path.is_dir():
                    target = f"{artifact_path}/{path.name}" if artifact_path else path.name
                    self._client.log_artifacts(run_id, str(path), target)
                else:
                    self._client.log_artifact(run_id, str(path), artifact_path or None)

    def log_trial_metrics(self, number: int, metrics: Mapping[str, float]) -> None:
        if metrics and number in self.children:
            self._log(self.children[number], metrics=metrics)

    # ------------------------------------------------------------------ study summary

    def log_study_summary(self, table: Mapping[str, Sequence[object]], figures: Mapping[str, Figure | PlotlyFigure],
                          metrics: Mapping[str, float]) -> None:
        """The Pareto table and plots on the parent run, plus study-level numbers."""
        # log_table would append to an existing pareto_table.json (a resumed study): write it whole instead,
        # in log_table's own layout (columns + rows).
        columns = list(table)
        rows = [list(row) for row in zip(*(table[c] for c in columns), strict=True)]
        self._client.log_text(self.parent_run_id, json.dumps({"columns": columns, "data": rows}), "pareto_table.json")
        for artifact_file, figure in figures.items():
            save_kwargs = {"include_plotlyjs": True} if artifact_file.endswith(".html") else None
            self._client.log_figure(self.parent_run_id, figure, artifact_file, save_kwargs=save_kwargs)
        self._log(self.parent_run_id, metrics=metrics)

    def log_study_curve(self, key: str, points: Sequence[tuple[float, float]]) -> None:
        """A curve on the parent run: one value of ``key`` per point, its step the point's seconds (MLflow plots
        a metric's history against its step). Written whole: a resumed study's curve replaces nothing, it adds
        the points its history lacks."""
        from mlflow.entities import Metric

        if not points:
            return
        logged = {m.step for m in self._client.get_metric_history(self.parent_run_id, clean_key(key))}
        now = int(time.time() * 1000)
        metrics = [Metric(clean_key(key), float(value), now, round(seconds))
                   for seconds, value in points if round(seconds) not in logged]
        if metrics:
            self._client.log_batch(self.parent_run_id, metrics=metrics)

    def add_study_seconds(self, seconds: Mapping[str, float]) -> None:
        """Add one run's seconds (``seconds_wall``, ``seconds_<category>``) to the parent run's totals over all the
        runs of the study: a resumed study adds its run, each run is the next step of the metrics' history, and a
        re-run that runs no trial does not call this."""
        current = self._client.get_run(self.parent_run_id).data.metrics
        step = len(self._client.get_metric_history(self.parent_run_id, "seconds_wall"))
        self._log(self.parent_run_id, metrics={k: current.get(clean_key(k), 0.0) + v for k, v in seconds.items()},
                  step=step)

    # ------------------------------------------------------------------ helpers

    def _log(self, run_id: str, params: Mapping[str, object] | None = None, metrics: Mapping[str, float] | None = None,
             tags: Mapping[str, str] | None = None, step: int = 0) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        self._client.log_batch(
            run_id,
            metrics=[Metric(clean_key(k), display_value(k, v), now, step) for k, v in (metrics or {}).items()],
            params=[Param(clean_key(k), str(v)[:6000]) for k, v in (params or {}).items()],
            tags=[RunTag(clean_key(k), str(v)[:8000]) for k, v in (tags or {}).items()],
        )
