"""The ``export.coreml`` stage: a Core ML ML Program (``<spec>.mlpackage``) of the float graph,
with the recipe's compression mirrored through ``coremltools.optimize``. Core ML files are
built and checked here; predictions need macOS, and the validation text says so.
The machinery is :mod:`paretorch.stages.export.coreml_export`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import nn

from paretorch.pipeline.core.stage import ExportConfig, ExportResult, Stage, StageContext
from paretorch.stages.export.coreml_export import export_coreml


class CoreMLExportConfig(ExportConfig):
    """Core ML ML Program (``.mlpackage``) of the float graph with the recipe's compression mirrored.

    * ``compute_units``: where Core ML may run the model (kept in the metadata;
      used for predictions on macOS).
    * ``minimum_deployment_target``: the ML Program opset; iOS18 / macOS15 enable
      per-block int4 and joint sparse + quantized weights.
    * ``palettize_bits``: optional k-means palettization of every weight the
      recipe's mirror left uncompressed.
    * ``batch_size``: the fixed input batch size of the package.
    * ``weight_threshold``: weights with fewer elements are never compressed
      (coremltools' default, 2048).
    """

    stage = "export.coreml"

    compute_units: Literal["ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE"] = "ALL"
    minimum_deployment_target: Literal["macOS13", "macOS14", "macOS15", "iOS16", "iOS17", "iOS18"] = "macOS14"
    palettize_bits: Literal[4, 6, 8] | None = None
    batch_size: int = Field(default=1, ge=1)
    weight_threshold: int = Field(default=2048, ge=0)


def apply(model: nn.Module, config: CoreMLExportConfig, ctx: StageContext) -> ExportResult:
    """Convert the float graph to ``<spec>.mlpackage``."""
    return export_coreml(model, config, ctx)


STAGE = Stage(CoreMLExportConfig, apply, produces="export", order=100, libraries=("coremltools",))
