"""The front is chosen from paired speed-ups (a fake clock, no sleeping): a trial timed during a busy
period keeps its ratio and its place, a trial whose timings swing stays off the front with its reason,
and one speed-up reaches the trial line, the table, the report rows and the MLflow metric."""

from __future__ import annotations

import inspect
import io
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import optuna
import pytest
import torch
from mlflow.tracking import MlflowClient
from rich.console import Console

from paretorch.pipeline.core.paired import UNSTABLE_ADVICE, Timed
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, registered
from paretorch.pipeline.search import Search, SearchConfig
from paretorch.pipeline.search.front import machine_line
from paretorch.pipeline.search.objectives import (
    ATTR_FEASIBLE,
    ATTR_LATENCY_UNSTABLE,
    ATTR_METRICS,
    ATTR_REASON,
    ATTR_REMEASURED,
    CONSTRAINT_NAME,
)
from paretorch.pipeline.search.pareto import pareto_rows, pareto_trials, table_columns
from paretorch.pipeline.tracking.tracker import TRIAL_TAG, experiment_name
from tests.pipeline.search.conftest import run_on_fake_clock, trials_by_seed

#: True latency (ms) per label; "busy" is timed while another job runs (everything 10x slower).
TRUE_MS = {None: 1.0, "busy": 0.5, "quiet": 0.8}
WILD_MS = [0.1, 2.0, 0.2, 1.5, 0.15, 3.0, 0.3, 0.12, 2.5, 0.2]  # median ratio 4.2x, 95% CI [0.4, 8.3]


class FakeTimer:
    """Times each side by its label: order-free, no clock, no sleeping."""

    def __init__(self) -> None:
        self.wild: Iterator[float] = itertools.cycle(WILD_MS)

    def warm_up(self, sides: Sequence[Timed]) -> None:
        pass

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        labels = [getattr(inspect.unwrap(fn), "paretorch_label", None) for fn, _ in sides]
        busy = 10.0 if "busy" in labels else 1.0
        return [next(self.wild) if label == "wild" else TRUE_MS[label] * busy for label in labels]


@pytest.fixture(scope="module")
def paired_search(residual_spec: ModelSpec, tag_stage: Stage,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Search]:
    folder = tmp_path_factory.mktemp("paired")
    pipeline_file = folder / "tagged.yaml"
    pipeline_file.write_text("nodes:\n  - {op: model}\n  - {op: toy.tag}\n  - {name: evaluate, op: evaluate}\n")
    seeds = [{"name": label, "stages": [{"stage": "toy.tag", "label": label}]} for label in ("busy", "quiet", "wild")]
    config = SearchConfig.load(None, pipeline=str(pipeline_file), sampler="random", runtimes=("eager",),
                               latency_budget="quick", exports="none", seeds=seeds)
    with registered(tag_stage):
        yield run_on_fake_clock(residual_spec, config, folder, FakeTimer(), trials=4)


by_seed = trials_by_seed


def test_the_front_is_chosen_from_paired_ratios(paired_search: Search) -> None:
    trials = by_seed(paired_search)
    busy, quiet = trials["busy"].user_attrs[ATTR_METRICS], trials["quiet"].user_attrs[ATTR_METRICS]
    # the busy trial's absolute times are the slowest of all (5 ms against 0.8 ms a call of the serve workload,
    # read per batch) ...
    batches = paired_search.model.latency.workload.batches  # type: ignore[union-attr]
    assert busy["latency_ms_paired"] == pytest.approx(5.0 / batches)
    assert quiet["latency_ms_paired"] == pytest.approx(0.8 / batches)
    # ... but paired with the baseline in the same rounds, it is the fastest
    assert busy["speedup"] == pytest.approx(2.0) and quiet["speedup"] == pytest.approx(1.25)
    assert busy["speedup_ci_low"] == pytest.approx(2.0) and busy["latency_attempts"] == 1
    front = [t.number for t in pareto_trials(paired_search.outcome.study)]  # type: ignore[attr-defined]
    assert front == [trials["busy"].number], "equal metrics: only the fastest paired trial is on the front"
    base = paired_search.outcome.baseline.latency_ms  # type: ignore[attr-defined]
    assert trials["busy"].values[1] == pytest.approx(base / 2.0), "objective latency: the baseline's / speed-up"
    assert trials["quiet"].values[1] == pytest.approx(base / 1.25)
    assert trials["baseline"].user_attrs[ATTR_METRICS]["speedup"] == pytest.approx(1.0)


def test_an_unstable_trial_is_kept_off_the_front_with_its_reason(paired_search: Search) -> None:
    wild = by_seed(paired_search)["wild"]
    metrics = wild.user_attrs[ATTR_METRICS]
    assert wild.state.name == "COMPLETE" and metrics["speedup"] > 3.0, "its median ratio would lead the front"
    assert metrics["latency_attempts"] == 3
    assert wild.user_attrs[ATTR_REASON].startswith("latency unstable: speed-up 95% CI [0.67, 5.00]")
    assert wild.user_attrs[ATTR_LATENCY_UNSTABLE] == wild.user_attrs[ATTR_REASON]
    # its metric is within the drop: feasible; its timing keeps it off the front (the Optuna constraint, not the tag)
    assert wild.user_attrs[ATTR_FEASIBLE] is True and wild.constraints[CONSTRAINT_NAME] > 0
    assert wild.number not in {t.number for t in pareto_trials(paired_search.outcome.study)}  # type: ignore[attr-defined]
    line = next(x for x in paired_search.output.splitlines()  # type: ignore[attr-defined]
                if x.startswith(f"trial {wild.number:3d}"))
    assert "latency unstable: " in line and "(off the front)" in line
    assert paired_search.outcome.machine.endswith(  # type: ignore[attr-defined]
        "over 4 trial(s); 1 trial(s) re-measured, 1 kept off the front (latency unstable)" + UNSTABLE_ADVICE)


def test_one_speedup_reaches_line_table_report_and_mlflow(paired_search: Search, residual_spec: ModelSpec) -> None:
    busy = by_seed(paired_search)["busy"]
    stored = busy.user_attrs[ATTR_METRICS]["speedup"]
    # the trial line
    line = next(x for x in paired_search.output.splitlines()  # type: ignore[attr-defined]
                if x.startswith(f"trial {busy.number:3d}"))
    assert f"{stored:.2f}x [2.00, 2.00] paired" in line
    # the printed table: the paired speed-up, and the end-of-study re-measure in its own column
    study = paired_search.outcome.study  # type: ignore[attr-defined]
    rows = pareto_rows(study, paired_search.plan.objectives)
    assert [(r.trial, r.speedup) for r in rows] == [(busy.number, stored)]
    assert rows[0].remeasured == pytest.approx(2.0) and study.user_attrs[ATTR_REMEASURED] == {
        str(busy.number): pytest.approx(2.0)}
    table = Console(file=io.StringIO(), width=400)
    table.print(paired_search.outcome.table)  # type: ignore[attr-defined]
    assert f"{stored:.2f}x [2.00, 2.00]" in table.file.getvalue()  # type: ignore[attr-defined]
    # the report: a new process reads the same rows back from storage
    again = Search(residual_spec, torch.device("cpu"), paired_search.plan.config, storage=paired_search.store.url,
                   track=False)
    report = pareto_rows(again.store.open_study(create=False), again.plan.objectives)
    assert report == rows
    assert table_columns(report, again.plan.objectives)["speedup"] == [round(stored, 2)]
    # MLflow: the child run's speedup (the runs table sorts by it), and the re-measure under its own name
    client = MlflowClient(tracking_uri=paired_search.store.tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name(residual_spec.name))
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{TRIAL_TAG}` = '{busy.number}'")
    assert len(runs) == 1
    assert runs[0].data.metrics["speedup"] == pytest.approx(stored)
    assert runs[0].data.metrics["speedup_remeasured"] == pytest.approx(2.0)


def test_the_machine_line_counts_only_trials_within_the_drop_as_kept_off_for_timing(tmp_path: Path) -> None:
    """A trial over the allowed drop whose timing was unstable is off the front for its metric: the machine line
    does not say its "metric is within the drop" (issue 46: `prune sparse 0.1 | ort`, drop 0.078 over 0.01)."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'm.db'}", directions=["maximize", "minimize"])
    paired = {"speedup_ci_width_pct": 10.0, "machine_load": 1.0, "machine_cores": 2.0}
    for feasible in (False, False):
        study.add_trial(optuna.trial.create_trial(
            values=[0.9, 1.0], user_attrs={ATTR_METRICS: paired, ATTR_FEASIBLE: feasible,
                                           ATTR_LATENCY_UNSTABLE: "timing not settled"}))
    line = machine_line(study)
    assert line is not None and "0 kept off the front (latency unstable)" in line
    assert UNSTABLE_ADVICE not in line
    study.add_trial(optuna.trial.create_trial(
        values=[0.99, 1.0], user_attrs={ATTR_METRICS: paired, ATTR_FEASIBLE: True,
                                        ATTR_LATENCY_UNSTABLE: "timing not settled"}))
    line = machine_line(study)
    assert line is not None and line.endswith("1 kept off the front (latency unstable)" + UNSTABLE_ADVICE)
