"""An export stage times its file with the user's budget and batch (the stage context's, from the run), never an
unnamed default: scripted, the default budget at the spec's batch sizes; in a run, the runner's settings and batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from paretorch.pipeline.core.latency import LatencySettings, LatencyStats, batch_size_of, default_latency
from paretorch.pipeline.core.spec import Batch, ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply_stage
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.runner import Runner
from paretorch.stages.export import checks
from paretorch.stages.export.onnx import ONNXExportConfig

CPU = torch.device("cpu")
#: Not a budget of LATENCY_BUDGETS: what reaches the export is this very object.
OWN = LatencySettings(warmup_runs=1, min_runs=3, min_seconds=0.0)


@pytest.fixture()
def timed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[LatencySettings, int]]:
    """The settings and batch size of every latency the ONNX export times (timed for real)."""
    seen: list[tuple[LatencySettings, int]] = []
    real = checks.measure_latency

    def recording(fn: Callable[..., object], inputs: Batch, device: torch.device,
                  settings: LatencySettings) -> LatencyStats:
        seen.append((settings, batch_size_of(inputs)))
        return real(fn, inputs, device, settings)

    monkeypatch.setattr(checks, "measure_latency", recording)
    return seen


def test_scripted_an_export_times_with_the_default_budget(residual_spec: ModelSpec, tmp_path: Path,
                                                         timed: list[tuple[LatencySettings, int]]) -> None:
    ctx = StageContext(residual_spec, CPU, output_dir=tmp_path)
    result = apply_stage(residual_spec.build(), ONNXExportConfig(quantize="none"), ctx)
    assert timed == [(default_latency(), 1), (default_latency(), 8)], "the spec's batch sizes, the default budget"
    assert {"onnx_latency_ms_p50_b1", "onnx_latency_ms_p50_b8"} <= set(result.metrics)  # type: ignore[union-attr]


def test_in_a_run_an_export_times_with_the_runners_budget_and_batch(residual_spec: ModelSpec, tmp_path: Path,
                                                                    timed: list[tuple[LatencySettings, int]]) -> None:
    runner = Runner(recipe_pipeline([ONNXExportConfig(quantize="none")]), residual_spec, CPU,
                    cache=NodeCache(export_dir=tmp_path / "exports"), latency=OWN, batch_sizes=(8,),
                    work_dir=tmp_path / "work")
    result = runner.run(evaluate=False)
    assert len(timed) == 1 and timed[0][0] is OWN and timed[0][1] == 8
    metrics = result.exports["export.onnx"].metrics
    assert [key for key in metrics if key.startswith("onnx_latency")] == ["onnx_latency_ms_p50_b8"]
