"""The benchmark's held-out check scores the search's best recipe under its own runtime, ONNX Runtime too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paretorch.experiments.bench import harness, recipe_rows
from paretorch.experiments.bench.harness import held_out_check, measure_recipe
from paretorch.pipeline.core.device import move_module
from paretorch.pipeline.core.evaluate import task_metric
from paretorch.pipeline.core.runtimes.eager import Eager
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.task_data import load_task_data
from paretorch.pipeline.core.task_spec import with_task_data
from paretorch.pipeline.search.allowed_drop import AllowedDrop
from paretorch.stages.quantize.stage import QuantizeConfig


@pytest.fixture()
def held_out_file(digits_spec: ModelSpec, tmp_path: Path) -> Path:
    """The digits evaluation split as a labelled ``.pt`` table (what ``--held-out`` reads)."""
    batches = list(digits_spec.evaluation())
    inputs = torch.cat([b[0][0] for b in batches])
    labels = torch.cat([b[1] for b in batches])
    path = tmp_path / "held-out.pt"
    torch.save({"inputs": inputs, "labels": labels}, path)
    return path


def test_an_onnxruntime_best_is_scored_through_its_session(digits_spec: ModelSpec, held_out_file: Path) -> None:
    cpu = torch.device("cpu")
    configs = [QuantizeConfig(method="int8_dynamic")]
    report, _, prepare, _ = measure_recipe(digits_spec, cpu, configs, "onnxruntime", (8,))
    assert "onnxruntime" in report.device, "the recipe was measured through ORT"
    fn = prepare()
    assert type(fn).__module__ == "paretorch.pipeline.core.ort_session", "scored by the file's session, not torch"
    held = held_out_check(digits_spec, cpu, held_out_file, prepare, "onnxruntime", (8,), AllowedDrop("absolute", 0.01))
    assert held["runtime"] == "onnxruntime" and held["rows"] == len(torch.load(held_out_file)["labels"])
    assert held["best"] == pytest.approx(report.metric_value, abs=1e-9), "the same data as the evaluation split"
    assert held["within_allowed"] is True


def test_a_compiled_best_is_scored_as_the_search_scores_it(digits_spec: ModelSpec, held_out_file: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiled runtime's held-out score: chunks of the largest latency batch size (evaluate_model's, through the
    one scoring function the replayed recipe rows use too)."""
    assert harness.task_metric is recipe_rows.task_metric is task_metric
    cpu = torch.device("cpu")
    monkeypatch.setattr(Eager, "compiles", True)
    model = move_module(digits_spec.build(), cpu).eval()
    sizes: list[int] = []

    def recording(*inputs: torch.Tensor) -> torch.Tensor:
        sizes.append(int(inputs[0].shape[0]))
        return model(*inputs)

    held = held_out_check(digits_spec, cpu, held_out_file, lambda: recording, "eager", (1, 8),
                          AllowedDrop("absolute", 0.01))
    assert set(sizes) == {8}
    assert held["best"] == held["baseline"] == task_metric(
        model, with_task_data(digits_spec, load_task_data(str(held_out_file))), cpu, "eager", (8, 1))
    assert held["drop"] == 0.0 and held["within_allowed"] is True
