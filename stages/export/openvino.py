"""The ``export.openvino`` stage: an OpenVINO IR (``.xml`` + ``.bin``) of the float graph with NNCF's int8
mirror of the quantize stage and the recipe's inference precision, checked and measured with OpenVINO.
Not in the default pipeline (``order=None``): the ``openvino`` runtime makes it on demand. The machinery is
:mod:`paretorch.stages.export.openvino_export`."""

from __future__ import annotations

from typing import Literal

from torch import nn

from paretorch.pipeline.core.stage import ExportConfig, ExportResult, Stage, StageContext
from paretorch.stages.export.openvino_export import export_openvino


class OpenVINOExportConfig(ExportConfig):
    """OpenVINO IR of the float graph, NNCF-mirrored, checked and measured with OpenVINO.

    * ``quantize``: ``mirror`` the recipe's int8 methods (static int8 -> ``nncf.quantize`` calibrated on the
      spec's calibration data; int8 weight-only -> ``nncf.compress_weights``), or ``none``.
    * ``inference_precision``: OpenVINO's ``INFERENCE_PRECISION_HINT``: ``f32``, ``bf16``, or ``auto``
      (bf16 when the recipe's AMP runs the whole model in bfloat16; for static int8 without AMP, the one
      OpenVINO picks by itself on this CPU, bf16 with AVX512-BF16 or AMX and f32 elsewhere, as
      sentence-transformers' OpenVINO + NNCF int8 runs; else f32); the resolved config records the one used.
    * ``model_type``: NNCF's model type for static int8: ``transformer`` (its transformer scheme, with
      SmoothQuant), ``default``, or ``auto`` (transformer when the model takes token inputs); resolved.
    * ``unmirrored``: what a numeric stage OpenVINO cannot reproduce does: a ``note`` in the validation
      text, or the export is ``infeasible`` (what the ``openvino`` runtime asks).
    * ``measure_latency``: OpenVINO latency per batch size in the metrics (the spec's batch sizes, or the
      run's: a search's ``--latency-batch``), timed with the user's ``--latency-budget``.
    * ``measure_metric``: the spec metric of the file over the evaluation split, with OpenVINO, in the metrics
      (``<prefix>_<metric>``).
    """

    stage = "export.openvino"

    quantize: Literal["mirror", "none"] = "mirror"
    inference_precision: Literal["auto", "f32", "bf16"] = "auto"
    model_type: Literal["auto", "transformer", "default"] = "auto"
    unmirrored: Literal["note", "infeasible"] = "note"
    measure_latency: bool = True
    measure_metric: bool = True


def apply(model: nn.Module, config: OpenVINOExportConfig, ctx: StageContext) -> ExportResult:
    """Convert the float graph to ``<spec>.openvino/<spec>.xml`` (+ ``.bin``)."""
    return export_openvino(model, config, ctx)


STAGE = Stage(OpenVINOExportConfig, apply, produces="export", order=None, libraries=("openvino", "nncf"))
