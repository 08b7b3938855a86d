"""The bench's rows are paired with fp32 eager, as the search pairs its trials: each row's speed-up is the median of
per-round ratios in rounds alternating with the baseline in the same process, with a 95% interval; the function
timed is the one the row's runner measured. BENCHMARKS.md shows the paired figure where a row has one."""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from paretorch.experiments.bench import harness
from paretorch.experiments.bench.render import render_table
from paretorch.pipeline.core.latency import LatencySettings
from paretorch.pipeline.core.paired import Timed
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.search.allowed_drop import AllowedDrop
from paretorch.stages.prune.stage import PruneConfig

CPU = torch.device("cpu")
#: Seconds, not the bench's thorough budget: 10 rounds of 5 calls a side.
FAST = LatencySettings(warmup_runs=2, min_runs=3, min_seconds=0.0, rounds=10, round_runs=5, round_seconds=0.0)


@pytest.fixture()
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "BENCH_LATENCY", FAST)


class RecordingTimer:
    """Times nothing: records which functions (the model behind a workload's call) and input shapes each round
    timed; the baseline 2 ms, others 1 ms."""

    def __init__(self, baseline: object) -> None:
        self.baseline = baseline
        self.timed: list[tuple[object, tuple[int, ...]]] = []

    def warm_up(self, sides: Sequence[Timed]) -> None:
        pass

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        self.timed += [(inspect.unwrap(fn), tuple(inputs[0].shape) if inputs else ()) for fn, inputs in sides]
        return [2.0 if inspect.unwrap(fn) is self.baseline else 1.0 for fn, _ in sides]


def test_a_row_pairs_the_function_its_runner_measured_with_the_baseline(digits_spec: ModelSpec, fast: None) -> None:
    """On the search's workload (serve: host inputs to host outputs, no device batch given) and as the model call
    alone at the objective batch, each the very function the row's runner measured against the baseline."""
    served = harness.paired_timing(digits_spec, CPU, 8, (1, 8))
    called = harness.paired_timing(digits_spec, CPU, 8, (1, 8), "model")
    assert served.workload is not None and called.workload is None
    timers = []
    for timing in (served, called):
        timing.timer = timer = RecordingTimer(timing.baseline())
        timers.append(timer)
    measured, (paired, model_call) = harness.measure_row(digits_spec, CPU, [PruneConfig(ratio=0.3)], "eager", (1, 8),
                                                         (served, called))
    assert model_call is not None
    for timing, timer in zip((served, called), timers, strict=True):
        assert {id(fn) for fn, _ in timer.timed} == {id(timing.baseline()), id(measured.fn)}
        assert measured.fn is not timing.baseline()
    assert {shape for _, shape in timers[0].timed} == {()}, "the workload runs from its own host inputs"
    assert {shape[0] for _, shape in timers[1].timed} == {8}, "the model call timed at the objective batch"
    assert len(timers[1].timed) == 2 * FAST.rounds and model_call.rounds == FAST.rounds
    assert paired.speedup == pytest.approx(2.0) and model_call.ci == pytest.approx((2.0, 2.0))
    row = harness.row_from_report("structured prune 0.3", "single", "prune", measured.report, 0.9, digits_spec,
                                  paired=(paired, model_call))
    assert row.speedup == paired.speedup and row.speedup_ci == paired.ci and row.speedup_unstable is None
    assert row.workload == "serve" and row.end_to_end and row.model_call_speedup == pytest.approx(2.0)
    assert set(row.latency_ms_p50) == {"1", "8"}, "the p50s timed alone are kept beside the paired speed-up"


def test_the_bench_pairs_the_baseline_with_itself_and_renders_the_paired_figure(fast: None) -> None:
    """No search, no single rows: the baseline row alone, paired with a copy of fp32 eager, is about 1.0x."""
    result = harness.bench("digits", "cpu", trials=0, batch=8, max_drop=AllowedDrop("absolute", 0.01),
                           singles=False)
    result = json.loads(json.dumps(result))  # as BENCHMARKS.md reads it back
    (row,) = result["rows"]
    low, high = row["speedup_ci"]
    assert row["kind"] == "baseline"  # (on a busy core the interval may stay wider than 20%: unstable, still 1.0)
    # A 95 % interval misses its true value one time in twenty: the check is a wide band around 1.0, not the
    # interval's coverage (a bias of the pairing, e.g. one side always first, moves the ratio far more).
    assert 0.8 <= row["speedup"] <= 1.25 and low <= row["speedup"] <= high, (
        f"fp32 eager against itself: {row['speedup']:.3f}x [{low:.3f}, {high:.3f}]")
    assert result["latency_settings"]["rounds"] == FAST.rounds
    table = render_table(result)
    unstable = " (unstable)" if row["speedup_unstable"] else ""  # the renderer's suffix on a busy core
    assert f"| {row['speedup']:.2f}x [{low:.2f}, {high:.2f}]{unstable} |" in table
    assert "speed-up vs fp32 (paired) [95% CI]" in table and "10 rounds alternating with fp32 eager" in table


def _row(name: str, kind: str, ms: float, speedup: float | None, drop: float = 0.0) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "kind": kind, "recipe": name, "metric": 1.0 - drop, "drop": drop,
                           "latency_ms_p50": {"1": ms}, "latency_ms_p90": {"1": ms}, "size_bytes": 2048,
                           "compile_seconds": 0.0, "note": ""}
    if speedup is not None:
        row |= {"speedup": speedup, "speedup_ci": [0.9 * speedup, 1.1 * speedup], "speedup_unstable": None}
    return row


def _result(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "device": "cuda (test)", "objective_batch": 1, "metric": "accuracy", "torch": "x",
            "date": "today", "max_drop": 0.01, "rows": rows, "baseline_recheck_ms_p50": {"1": 7.4},
            "latency_settings": {"min_runs": 50, "min_seconds": 1.0, "rounds": 20}}


def test_paired_rows_show_the_paired_speed_up_not_the_ratio_of_p50s_timed_apart() -> None:
    """fp32 eager drifted from 2.9 to 7.4 ms: the p50s timed alone say compile is 2.9 / 1.0 = 2.90x; paired, 1.50x."""
    rows = [_row("fp32 eager (baseline)", "baseline", 2.9, 1.0), _row("compile", "single", 1.0, 1.5),
            _row("amp", "single", 1.2, 2.0),
            _row("int8", "single", 0.5, 9.0, drop=0.05),  # over the allowed drop: not the best single
            _row("failed row", "single", float("nan"), None),
            _row("search best (30 trials)", "search", 0.8, 5.0)]
    rows[-1]["speedup_unstable"] = "speed-up 95% CI too wide"
    rows[-2]["latency_ms_p50"] = {}
    table = render_table(_result(rows))
    compile_line = next(line for line in table.splitlines() if line.startswith("| compile:"))
    assert "| 1.000 | 1.50x [1.35, 1.65] |" in compile_line and "2.90x" not in compile_line
    assert "| 2.900 | 1.00x [0.90, 1.10] |" in table
    assert "| 5.00x [4.50, 5.50] (unstable) |" in table
    assert "| failed row: `failed row` | 1.0000 | +0.0000 | - | - |" in table
    # the search against the best single within the drop by paired speed-up: amp (2.0x), not compile (faster p50)
    assert "2.50x vs best single (amp)" in table
    assert "so drift between rows does not enter them" in table and "speed-ups use the first" not in table


def test_a_result_written_before_rows_were_paired_renders_as_before() -> None:
    rows = [_row("fp32 eager (baseline)", "baseline", 4.0, None), _row("compile", "single", 2.0, None),
            _row("search best (30 trials)", "search", 1.0, None)]
    table = render_table(_result(rows))
    assert "| 4.000 | 1.00x |" in table and "| 2.000 | 2.00x |" in table and "| 1.000 | 4.00x |" in table
    assert "2.00x vs best single (compile)" in table and "(paired)" not in table and "rounds alternating" not in table
    assert "speed-ups use the first" in table
