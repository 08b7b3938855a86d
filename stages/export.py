"""The export stages: Core ML (``export.coreml``), ONNX (``export.onnx``) and
ExportedProgram (``export.pt2``).

Each stage writes one artifact named after the spec (``digits.mlpackage``,
``digits.onnx``, ``digits.pt2``) under ``ctx.output_dir``, atomically: it is
converted and validated in a staging directory and only then moved into place,
so a failed export leaves nothing behind. Each returns an
:class:`~stages.registry.ExportResult` whose ``validation`` text says plainly
what was checked and what was not. Converter errors become
:class:`~pipeline.errors.InfeasibleConfig` quoting the converter.

Core ML and ONNX convert the float graph (``ctx.float_model``: the model
before quantize / amp) and mirror the recipe's compression with their own
tools; ``export.pt2`` exports the final model itself. The machinery lives in
:mod:`stages.exporters`.

Exports are not searched: :meth:`suggest` returns the default config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Self

from pydantic import Field
from torch import nn

from stages.registry import ExportResult, StageConfig, StageContext, register_stage

if TYPE_CHECKING:
    import optuna


class CoreMLExportConfig(StageConfig):
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

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """Exports are not searched: always the default config."""
        return cls()


class ONNXExportConfig(StageConfig):
    """Self-contained ONNX file of the float graph, int8-mirrored, checked and measured with onnxruntime.

    * ``opset``: ONNX opset (17 goes through the ONNX version converter).
    * ``dynamic_batch``: a symbolic batch dimension; else fixed at ``batch_size``.
    * ``quantize``: ``mirror`` the recipe's int8 methods, ``none``, or always
      ``int8_dynamic`` (onnxruntime dynamic quantization of linear layers).
    * ``measure_latency``: onnxruntime latency per spec batch size in the metrics.
    """

    stage = "export.onnx"

    opset: int = Field(default=18, ge=17, le=23)
    dynamic_batch: bool = True
    batch_size: int = Field(default=1, ge=1)
    quantize: Literal["mirror", "none", "int8_dynamic"] = "mirror"
    measure_latency: bool = True

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """Exports are not searched: always the default config."""
        return cls()


class PT2ExportConfig(StageConfig):
    """``torch.export`` ExportedProgram (``.pt2``) of the final model, as the recipe left it.

    * ``dynamic_batch``: a symbolic batch dimension (else fixed at the example's batch of 2).
    """

    stage = "export.pt2"

    dynamic_batch: bool = True

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """Exports are not searched: always the default config."""
        return cls()


@register_stage(CoreMLExportConfig, produces="export")
def apply_export_coreml(model: nn.Module, config: CoreMLExportConfig, ctx: StageContext) -> ExportResult:
    """Convert the float graph to ``<spec>.mlpackage`` (see :mod:`stages.exporters.coreml_export`)."""
    from stages.exporters.coreml_export import export_coreml

    return export_coreml(model, config, ctx)


@register_stage(ONNXExportConfig, produces="export")
def apply_export_onnx(model: nn.Module, config: ONNXExportConfig, ctx: StageContext) -> ExportResult:
    """Export the float graph to ``<spec>.onnx`` (see :mod:`stages.exporters.onnx_export`)."""
    from stages.exporters.onnx_export import export_onnx

    return export_onnx(model, config, ctx)


@register_stage(PT2ExportConfig, produces="export")
def apply_export_pt2(model: nn.Module, config: PT2ExportConfig, ctx: StageContext) -> ExportResult:
    """Export the final model to ``<spec>.pt2`` (see :mod:`stages.exporters.pt2_export`)."""
    from stages.exporters.pt2_export import export_pt2

    return export_pt2(model, config, ctx)
