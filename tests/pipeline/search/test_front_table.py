"""The Pareto table at 80, 100 and 120 columns: a one-line title, a baseline row, short recipes, no word cut."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console
from rich.table import Table

from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.task_metrics import ACCURACY
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.search.finish import runtime_export
from paretorch.pipeline.search.objectives import Baseline, Objectives
from paretorch.pipeline.search.pareto import FRONT_NOTE, ParetoRow, exports_cell, pareto_table
from paretorch.stages.export.onnx import ONNXExportConfig
from paretorch.stages.export.openvino import OpenVINOExportConfig
from paretorch.stages.quantize.stage import QuantizeConfig

#: The widest cells a study shows: a long metric name, ties, a re-measure outside its interval, repeats, a failed
#: export, amp and quantize with layers kept float under the longest runtime name.
ROWS = [
    ParetoRow(16, 0.9861, 0.0028, 0.207, 5.08, 1.2e6, "full recipe", "onnx, coreml (infeasible: no float8)",
              speedup_ci=(4.73, 5.18), ties=(3, 21), remeasured=4.68,
              short="prune 0.3 + distill 200 + int8s | ort (again in 22, 25)",
              export_status={"export.onnx": "ok", "export.coreml": "infeasible: no float8"}),
    ParetoRow(3, 0.9889, 0.0, 0.215, 4.90, 2.5e6, "full recipe", "not exported yet", speedup_ci=(4.89, 4.95),
              short="bf16 (12 fp32) + intxw g32 asym (2 float) | compile-dyn"),
]
TITLE = "minilm: Pareto front, 2 of 30 trials"


def objectives(residual_spec: ModelSpec) -> Objectives:
    spec = replace(residual_spec, metric=replace(ACCURACY, name="neighbour_agreement"))
    return Objectives.create(spec, ["metric", "latency"], "1%", 32)


def table(residual_spec: ModelSpec) -> Table:
    return pareto_table(ROWS, objectives(residual_spec), TITLE, Baseline(0.9889, 1.05, 1.2e7, trial=0),
                        [FRONT_NOTE, "re-timed: the front again with the baseline (1.050 ms), interleaved, 5 rounds"])


def render(front: Table, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, record=True)
    console.print(front)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_table_reads_at_terminal_widths_without_cutting_a_word(residual_spec: ModelSpec, width: int) -> None:
    front = table(residual_spec)
    text = render(front, width)
    lines = text.splitlines()
    assert lines[0].strip() == TITLE, "a one-line title"
    assert "…" not in text and max(map(len, lines)) <= width
    words = text.split()
    cells = [str(cell) for column in front.columns for cell in (column.header, *column.cells)]
    assert {row.short for row in ROWS} | {"5.08x [4.73, 5.18] ~ 3, 21", "onnx, no coreml", "not yet"} <= set(cells)
    missing = [word for cell in cells for word in cell.split() if word not in words]
    assert not missing, f"cut at {width} columns: {missing}\n{text}"
    baseline = next(line for line in lines if "baseline" in line.split())
    assert baseline.split()[:5] == ["0", "0.9889", "+0.0000", "1.050", "1.00x"], "the baseline's row comes first"
    assert "full recipe" not in text, "the console shows the short recipe; the full one is in the recipe file"


def test_the_file_a_runtime_ran_is_named_by_the_recipe_and_the_exports_cell() -> None:
    """An OpenVINO-runtime trial ships its IR: the saved recipe names the export that made it (so ``apply
    --output`` writes it too) and the exports column lists it beside the exports that ran at the end."""
    ov = OpenVINOExportConfig(inference_precision="f32", model_type="default")
    recipe = Recipe(stages=(QuantizeConfig(method="int8_dynamic"), ONNXExportConfig(), ov), runtime="openvino")
    assert runtime_export(recipe) == ov
    assert runtime_export(Recipe(stages=(ONNXExportConfig(),), runtime="eager")) is None
    assert exports_cell({"export.coreml": "ok", "export.onnx": "ok", ov.stage: "ok"}) == "coreml, onnx, openvino"
