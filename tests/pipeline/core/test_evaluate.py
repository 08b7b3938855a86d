"""Evaluation invariants: latency, sizes, parameter and MAC counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig
from paretorch.pipeline.core.evaluate import (
    STATE_DICT_FILENAME,
    LatencySettings,
    count_macs,
    count_params,
    evaluate_model,
    measure_latency,
    serialized_size_bytes,
)
from paretorch.pipeline.core.runtimes.compile import known_limits_infeasible
from paretorch.pipeline.core.spec import ModelSpec

QUICK = LatencySettings(warmup_runs=1, min_runs=5, min_seconds=0.0)


def test_macs_of_known_layers_are_exact() -> None:
    assert count_macs(nn.Linear(10, 20), (torch.randn(1, 10),)) == 10 * 20
    conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
    # every output element: 3 * 3 * 3 multiply-accumulates; 8 x 16 x 16 outputs
    assert count_macs(conv, (torch.randn(1, 3, 16, 16),)) == 8 * 16 * 16 * 27


class _FailsUnderDispatchMode(nn.Linear):
    """Stands in for an operator that does not pass through a dispatch mode (torchao's
    int8 matmul on CUDA under torch's flop counter): runs alone, fails under the counter."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.utils._python_dispatch._get_current_dispatch_mode() is not None:
            raise TypeError("unsupported operand type(s) for *: 'NotImplementedType' and 'Tensor'")
        return super().forward(x)


def test_macs_unknown_when_the_flop_counter_cannot_run_the_model(caplog: pytest.LogCaptureFixture) -> None:
    model, inputs = _FailsUnderDispatchMode(4, 2), (torch.randn(1, 4),)
    model(*inputs)  # the model itself runs
    assert count_macs(model, inputs) is None
    assert "MACs not counted" in caplog.text and "NotImplementedType" in caplog.text


def test_params_counted() -> None:
    assert count_params(nn.Linear(10, 20)) == 10 * 20 + 20


def test_size_equals_saved_file(tmp_path: Path) -> None:
    model = nn.Linear(64, 64)
    path = tmp_path / STATE_DICT_FILENAME
    torch.save(model.state_dict(), path)
    assert serialized_size_bytes(model) == path.stat().st_size


def test_latency_stats_are_ordered() -> None:
    stats = measure_latency(nn.Linear(32, 32), (torch.randn(4, 32),), torch.device("cpu"), QUICK)
    assert stats.batch_size == 4
    assert stats.runs >= 5
    assert 0 < stats.min_ms <= stats.p50_ms <= stats.p90_ms
    assert stats.first_call_ms > 0


def test_latency_respects_minimum_time() -> None:
    settings = LatencySettings(warmup_runs=0, min_runs=2, min_seconds=0.05)
    stats = measure_latency(nn.Linear(8, 8), (torch.randn(1, 8),), torch.device("cpu"), settings)
    assert stats.runs > 2  # a tiny layer runs far more than twice in 50 ms


def test_digits_evaluation_report(digits_model: nn.Module, digits_spec: ModelSpec) -> None:
    report = evaluate_model(digits_model, digits_spec, torch.device("cpu"), settings=QUICK)
    assert report.metric_name == "accuracy"
    assert set(report.latency) == {1, 32}
    for stats in report.latency.values():
        assert stats.p90_ms >= stats.p50_ms > 0
    assert report.size_bytes == serialized_size_bytes(digits_model)
    assert report.params == count_params(digits_model)
    assert report.macs > report.params  # convolutions reuse weights across positions
    assert report.peak_memory_bytes > 0
    metrics = report.as_metrics()
    assert metrics["latency_ms_p50_b32"] == report.latency[32].p50_ms
    assert report.compile_seconds == 0.0


def test_unknown_runtime_is_rejected(digits_model: nn.Module, digits_spec: ModelSpec) -> None:
    with pytest.raises(ConfigError, match="unknown runtime 'jit'"):
        evaluate_model(digits_model, digits_spec, torch.device("cpu"), runtime="jit", settings=QUICK)


def test_a_known_kernel_limit_of_compiled_code_is_infeasible_with_what_to_do() -> None:
    def small_int_mm(*_: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("self.size(0) needs to be greater than 16, but got 1")

    with pytest.raises(InfeasibleConfig, match=r"runtime compile: .*int8_dynamic in eager.*greater than 16"):
        known_limits_infeasible(small_int_mm, "compile")(torch.zeros(1))


def test_other_errors_of_compiled_code_pass_through_unchanged() -> None:
    def broken(*_: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match=r"^a bug$"):
        known_limits_infeasible(broken, "compile")(torch.zeros(1))
