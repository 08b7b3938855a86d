"""What ``import paretorch`` hands out (``paretorch.<name>``): the scripted reuse of the stages.

A model spec (:func:`resolve_spec` takes every ``MODEL=`` form; :class:`ModelSpec`, :class:`Metric` and
:data:`ACCURACY` to write one), the stage configs, one stage (:func:`apply_stage`) or a chain of them and a
recipe (:func:`run_chain`, :class:`Recipe`), the task metric (:func:`compute_metric`) and the packed encoder a
pack recipe deploys as (:class:`PackedEncoder`, or over an ONNX / OpenVINO file a ``GroupedEncoder``; rebuilt
from ``apply``'s files by :func:`load_deployment`). Each
name is the one defined under ``pipeline`` or ``stages``; this module only gathers them under the one import name.
"""

from __future__ import annotations

from paretorch.pipeline.api import ChainResult, StageContext, apply_stage, load_deployment, load_model, run_chain
from paretorch.pipeline.core.errors import PipelineError
from paretorch.pipeline.core.evaluate import compute_metric
from paretorch.pipeline.core.spec import ACCURACY, Metric, ModelSpec
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.sources import SourceOptions
from paretorch.pipeline.sources.resolve import resolve_spec
from paretorch.stages.amp.stage import AmpConfig
from paretorch.stages.distill.stage import DistillConfig
from paretorch.stages.export.coreml import CoreMLExportConfig
from paretorch.stages.export.onnx import ONNXExportConfig
from paretorch.stages.export.openvino import OpenVINOExportConfig
from paretorch.stages.export.pt2 import PT2ExportConfig
from paretorch.stages.pack.deploy import PackedEncoder
from paretorch.stages.pack.stage import PackConfig
from paretorch.stages.prune.stage import PruneConfig
from paretorch.stages.quantize.stage import QuantizeConfig

__all__ = [
    "ACCURACY",
    "AmpConfig",
    "ChainResult",
    "CoreMLExportConfig",
    "DistillConfig",
    "Metric",
    "ModelSpec",
    "ONNXExportConfig",
    "OpenVINOExportConfig",
    "PT2ExportConfig",
    "PackConfig",
    "PackedEncoder",
    "PipelineError",
    "PruneConfig",
    "QuantizeConfig",
    "Recipe",
    "SourceOptions",
    "StageContext",
    "apply_stage",
    "compute_metric",
    "load_deployment",
    "load_model",
    "resolve_spec",
    "run_chain",
]
