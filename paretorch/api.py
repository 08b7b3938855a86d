"""What ``import paretorch`` hands out (``paretorch.<name>``): the scripted reuse of the stages.

A model spec (:func:`resolve_spec` takes every ``MODEL=`` form; :class:`ModelSpec`, :class:`Metric` and
:data:`ACCURACY` to write one), the stage configs, one stage (:func:`apply_stage`) or a chain of them and a
recipe (:func:`run_chain`, :class:`Recipe`), the task metric (:func:`compute_metric`) and the packed encoder a
pack recipe deploys as (:class:`PackedEncoder`, or over an ONNX / OpenVINO file a ``GroupedEncoder``; rebuilt
from ``apply``'s files by :func:`load_deployment`). Each
name is the one defined under ``pipeline`` or ``stages``; this module only gathers them under the one import name.
"""

from __future__ import annotations

from pipeline.api import ChainResult, StageContext, apply_stage, load_deployment, load_model, run_chain
from pipeline.core.errors import PipelineError
from pipeline.core.evaluate import compute_metric
from pipeline.core.spec import ACCURACY, Metric, ModelSpec
from pipeline.engine.recipe import Recipe
from pipeline.sources import SourceOptions
from pipeline.sources.resolve import resolve_spec
from stages.amp.stage import AmpConfig
from stages.distill.stage import DistillConfig
from stages.export.coreml import CoreMLExportConfig
from stages.export.onnx import ONNXExportConfig
from stages.export.openvino import OpenVINOExportConfig
from stages.export.pt2 import PT2ExportConfig
from stages.pack.deploy import PackedEncoder
from stages.pack.stage import PackConfig
from stages.prune.stage import PruneConfig
from stages.quantize.stage import QuantizeConfig

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
