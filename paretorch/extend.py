"""The extension kit: every name a stage or runtime plugin imports, the stable surface for plugins.

A plugin package (a stage, a runtime, a model spec: one module plus one entry-point line in its own
``pyproject.toml``) imports paretorch through this module alone::

    from paretorch.extend import Stage, StageConfig, StageContext        # a stage
    from paretorch.extend import ExportHandle, Runtime, RuntimeExport    # a runtime

and tests itself with :mod:`paretorch.testing` (``StageContract``, ``RuntimeContract``). The names are the
project's own objects, re-exported (``paretorch.extend.Stage is paretorch.pipeline.core.stage.Stage``), listed in
:data:`__all__`; the modules they live in are internal and may move, these names stay. Importing this module loads
torch and pydantic (the stage API needs them), never a converter, a runtime's toolkit or MLflow.

What is here:

* the stage API: :class:`Stage`, :class:`StageConfig` (frozen, validated, with its ``suggest``),
  :class:`ExportConfig`, :class:`StageContext`, :class:`ExportResult`, :class:`BudgetUse`, :func:`apply_stage`,
  :func:`export_mirror`, :func:`config_from_dict`, :data:`STAGES_ENTRY_POINT_GROUP`;
* how exports mirror a stage: :class:`ExportMirror`, :class:`NotMirrored`, :class:`MirrorFacts`, :class:`Need`,
  the built-in stages' facts (:class:`WeightQuantization`, :class:`ReducedPrecision`, :class:`Sparsity`,
  :class:`PaddingFree`) and the scheme names runtimes declare (:func:`quant_scheme`, :func:`quant_group`);
* the runtime API: :class:`Runtime`, :class:`RuntimeExport`, :class:`ExportHandle`, :class:`LoadedModel`,
  :class:`NoExport`, :class:`Reproduces` (what a runtime declares it reproduces), :data:`TORCHSCRIPT`,
  :data:`PACK`, the machine probe's :data:`EngineProbe`, :class:`Gain`, :func:`paired_gain`,
  :data:`RUNTIMES_ENTRY_POINT_GROUP`;
* what a stage reads: :class:`ModelSpec`, :data:`Batch`, :data:`LabelledBatch`, :class:`Metric`,
  :data:`ACCURACY`, :class:`Capabilities` (``requires`` reads it), :class:`ModelFacts`, :func:`is_scripted`,
  :func:`is_token_input`, :func:`move_module`, :func:`phase` (a long step's progress line);
* errors: :class:`PipelineError`, :class:`ConfigError` (a user's mistake: one ``error:`` line),
  :class:`InfeasibleConfig` (this config cannot run here: the trial is infeasible with the reason),
  :class:`SpecError`, :class:`DeviceError`;
* the export helpers the built-in exports share: :func:`atomic_artifact`, :func:`artifact_size_bytes` (an
  artifact complete or absent), :func:`run_reference`, :func:`compare_outputs`, :class:`OutputComparison`,
  :func:`require_close`, :func:`converter_failure`, :func:`float_graph_on_cpu`, :func:`cpu_inputs`,
  :func:`flatten_outputs` (output checks), :func:`artifact_metadata` (the recipe and versions an artifact
  carries), :class:`LayerFilter`, :func:`module_weight_key` (the layers a mirrored quantization touches).

``plugins/mlx`` (the ``mlx`` runtime and its ``export.mlx`` stage) is built on these names alone.
"""

from __future__ import annotations

from paretorch.pipeline.core.device import Capabilities, move_module
from paretorch.pipeline.core.errors import ConfigError, DeviceError, InfeasibleConfig, PipelineError, SpecError
from paretorch.pipeline.core.length_groups import PACK
from paretorch.pipeline.core.machine_probe import EngineProbe, Gain, paired_gain
from paretorch.pipeline.core.mirror import ExportMirror, MirrorFacts, Need, NotMirrored, quant_group, quant_scheme
from paretorch.pipeline.core.model_facts import ModelFacts, is_scripted
from paretorch.pipeline.core.progress import phase
from paretorch.pipeline.core.runtimes.base import ExportHandle, LoadedModel, NoExport, Runtime, RuntimeExport
from paretorch.pipeline.core.runtimes.registry import ENTRY_POINT_GROUP as RUNTIMES_ENTRY_POINT_GROUP
from paretorch.pipeline.core.runtimes.reproduces import TORCHSCRIPT, Reproduces
from paretorch.pipeline.core.spec import ACCURACY, Batch, LabelledBatch, Metric, ModelSpec
from paretorch.pipeline.core.stage import (
    ENTRY_POINT_GROUP as STAGES_ENTRY_POINT_GROUP,
)
from paretorch.pipeline.core.stage import (
    BudgetUse,
    ExportConfig,
    ExportResult,
    Stage,
    StageConfig,
    StageContext,
    apply_stage,
    config_from_dict,
    export_mirror,
)
from paretorch.pipeline.core.token_inputs import is_token_input
from paretorch.stages.common.mirror_facts import PaddingFree, ReducedPrecision, Sparsity, WeightQuantization
from paretorch.stages.export.atomic import artifact_size_bytes, atomic_artifact
from paretorch.stages.export.checks import (
    OutputComparison,
    compare_outputs,
    converter_failure,
    cpu_inputs,
    flatten_outputs,
    float_graph_on_cpu,
    require_close,
    run_reference,
)
from paretorch.stages.export.layer_filter import LayerFilter, module_weight_key
from paretorch.stages.export.metadata import artifact_metadata

__all__ = [
    "ACCURACY",
    "PACK",
    "RUNTIMES_ENTRY_POINT_GROUP",
    "STAGES_ENTRY_POINT_GROUP",
    "TORCHSCRIPT",
    "Batch",
    "BudgetUse",
    "Capabilities",
    "ConfigError",
    "DeviceError",
    "EngineProbe",
    "ExportConfig",
    "ExportHandle",
    "ExportMirror",
    "ExportResult",
    "Gain",
    "InfeasibleConfig",
    "LabelledBatch",
    "LayerFilter",
    "LoadedModel",
    "Metric",
    "MirrorFacts",
    "ModelFacts",
    "ModelSpec",
    "Need",
    "NoExport",
    "NotMirrored",
    "OutputComparison",
    "PaddingFree",
    "PipelineError",
    "ReducedPrecision",
    "Reproduces",
    "Runtime",
    "RuntimeExport",
    "Sparsity",
    "SpecError",
    "Stage",
    "StageConfig",
    "StageContext",
    "WeightQuantization",
    "apply_stage",
    "artifact_metadata",
    "artifact_size_bytes",
    "atomic_artifact",
    "compare_outputs",
    "config_from_dict",
    "converter_failure",
    "cpu_inputs",
    "export_mirror",
    "flatten_outputs",
    "float_graph_on_cpu",
    "is_scripted",
    "is_token_input",
    "module_weight_key",
    "move_module",
    "paired_gain",
    "phase",
    "quant_group",
    "quant_scheme",
    "require_close",
    "run_reference",
]
