"""The ``export.onnx`` stage: a self-contained ONNX file of the float graph, with ONNX Runtime's
transformer fusions and its int8 mirror of the quantize stage, checked and measured with onnxruntime.
The machinery is :mod:`paretorch.stages.export.onnx_export`; the ``onnxruntime`` runtime runs this stage's file."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import nn

from paretorch.pipeline.core.stage import ExportConfig, ExportResult, Stage, StageContext
from paretorch.stages.export.onnx_export import export_onnx


class ONNXExportConfig(ExportConfig):
    """Self-contained ONNX file of the float graph, int8-mirrored, checked and measured with onnxruntime.

    * ``opset``: ONNX opset (17 goes through the ONNX version converter).
    * ``dynamic_batch``: a symbolic batch dimension; else fixed at ``batch_size``.
    * ``quantize``: ``mirror`` the recipe's int8 methods (dynamic int8 -> onnxruntime dynamic int8,
      static int8 -> onnxruntime static QDQ int8 calibrated on the spec's calibration data), ``none``,
      or always ``int8_dynamic`` (onnxruntime dynamic quantization of linear layers).
    * ``fusions``: onnxruntime's offline transformer fusions: ``bert``, ``none``, or ``auto`` (bert
      when the model takes token inputs, else none).
    * ``unmirrored``: what a numeric stage ONNX Runtime cannot reproduce does: a ``note`` in the
      validation text, or the export is ``infeasible`` (what the ``onnxruntime`` runtime asks).
    * ``measure_latency``: onnxruntime latency per batch size in the metrics (the spec's batch sizes, or the
      run's: a search's ``--latency-batch``), timed with the user's ``--latency-budget``.
    * ``measure_metric``: the spec metric of the file over the evaluation split, with onnxruntime, in the metrics
      (``<prefix>_<metric>``).
    """

    stage = "export.onnx"

    opset: int = Field(default=18, ge=17, le=23)
    dynamic_batch: bool = True
    batch_size: int = Field(default=1, ge=1)
    quantize: Literal["mirror", "none", "int8_dynamic"] = "mirror"
    fusions: Literal["auto", "bert", "none"] = "auto"
    unmirrored: Literal["note", "infeasible"] = "note"
    measure_latency: bool = True
    measure_metric: bool = True


def apply(model: nn.Module, config: ONNXExportConfig, ctx: StageContext) -> ExportResult:
    """Export the float graph to ``<spec>.onnx``."""
    return export_onnx(model, config, ctx)


STAGE = Stage(ONNXExportConfig, apply, produces="export", order=110,
              libraries=("onnx", "onnxscript", "onnx-ir", "onnxruntime"))  # onnxruntime: its int8, its check
