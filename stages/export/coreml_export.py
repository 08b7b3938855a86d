"""Core ML export: convert the float graph to an ML Program, mirror the recipe, validate, write atomically.

coremltools cannot convert a torchao-quantized graph, so the float graph
(``ctx.float_model``) is converted - through ``torch.export`` first, then
``torch.jit.trace`` (:mod:`paretorch.stages.export.coreml_convert`), with the compute
precision of the recipe's AMP policy - and the recipe's compression is
re-applied with ``coremltools.optimize.coreml``
(:mod:`paretorch.stages.export.coreml_compress`). The package is reloaded and its
inputs and outputs checked; on macOS it is also run and compared with torch.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import Batch
from paretorch.pipeline.core.stage import ExportResult, StageContext, export_mirror
from paretorch.stages.common.mirror_facts import PaddingFree, ReducedPrecision
from paretorch.stages.export.atomic import artifact_size_bytes, atomic_artifact
from paretorch.stages.export.checks import (
    OutputComparison,
    compare_outputs,
    converter_failure,
    cpu_inputs,
    float_graph_on_cpu,
    require_close,
    run_reference,
)
from paretorch.stages.export.coreml_compress import compressed_weight_ops, mirror_compression
from paretorch.stages.export.coreml_convert import convert_float_graph
from paretorch.stages.export.layer_filter import LayerFilter
from paretorch.stages.export.metadata import RECIPE_KEY, artifact_metadata

if TYPE_CHECKING:
    from paretorch.stages.export.coreml import CoreMLExportConfig

NOT_PREDICTED = "not predicted: Core ML predictions need macOS"


def export_coreml(model: nn.Module, config: CoreMLExportConfig, ctx: StageContext) -> ExportResult:
    """Write ``<spec name>.mlpackage`` under ``ctx.output_dir`` and say how it was checked."""
    output_dir = ctx.require_output_dir()
    upstream = export_mirror(ctx.upstream)
    float_model = float_graph_on_cpu(model, ctx)
    inputs = cpu_inputs(ctx.spec, config.batch_size)
    reference = run_reference(float_model, inputs)
    import coremltools as ct  # ~5 s: only when a Core ML export runs

    name = f"{ctx.spec.name}.mlpackage"
    with atomic_artifact(output_dir, name) as staged:
        mlmodel, notes = convert_float_graph(ct, float_model, inputs, config, upstream.of(ReducedPrecision))
        try:
            mlmodel, compression_notes = mirror_compression(
                mlmodel,
                upstream,
                LayerFilter.from_upstream(upstream, ctx.spec.protected_layers, config.weight_threshold + 1),
                config.minimum_deployment_target,
                config.weight_threshold,
                config.palettize_bits,
            )
        except InfeasibleConfig:
            raise
        except Exception as exc:  # coremltools raises ValueError/NotImplementedError/... for unsupported layouts
            raise converter_failure("Core ML weight compression", exc) from exc
        notes += compression_notes
        notes += [f"not mirrored: {note}" for note in upstream.not_mirrored]
        if upstream.of(PaddingFree) is not None:
            notes.append("not mirrored: pack: the padded graph, computing every padding token (no per-length-group "
                         "call for Core ML here)")
        compressed = compressed_weight_ops(mlmodel)
        notes.append(f"compressed weight ops: {_describe_counts(compressed)}")
        metadata = artifact_metadata(ctx.upstream, "coremltools")
        metadata["paretorch.compute_units"] = config.compute_units
        mlmodel.user_defined_metadata.update(metadata)
        mlmodel.short_description = f"{ctx.spec.name}, exported by paretorch"
        mlmodel.save(str(staged))
        output_names = _check_package(ct, staged, inputs, reference)
        notes.append("reloaded; inputs and outputs checked")
        metrics: dict[str, float] = {"coreml_compressed_weight_ops": float(sum(compressed.values()))}
        if ctx.capabilities.coreml_predict:
            lossy = bool(compressed) or upstream.of(ReducedPrecision) is not None
            comparison = _predict_and_compare(ct, staged, config, inputs, reference, output_names, lossy)
            notes.append(f"predicted on {config.compute_units}: {comparison.describe()}")
            metrics["coreml_max_abs_error"] = comparison.max_abs_error
            metrics["coreml_cosine"] = comparison.cosine
        else:
            notes.append(NOT_PREDICTED)
    path = output_dir / name
    return ExportResult(
        format="coreml",
        path=path,
        size_bytes=artifact_size_bytes(path),
        validation="; ".join(notes),
        metrics=metrics,
    )


# --------------------------------------------------------------------------- validation


def _check_package(ct: ModuleType, path: Path, inputs: Batch, reference: list[Tensor]) -> list[str]:
    """Reload without compiling and check input/output count, names, shapes and the recipe metadata."""
    try:
        reloaded = ct.models.MLModel(str(path), skip_model_load=True)
    except Exception as exc:
        raise converter_failure("reloading the Core ML package", exc) from exc
    description = reloaded.get_spec().description
    declared_inputs, declared_outputs = list(description.input), list(description.output)
    if len(declared_inputs) != len(inputs):
        raise InfeasibleConfig(f"the Core ML model has {len(declared_inputs)} inputs, the spec gives {len(inputs)}")
    for feature, tensor in zip(declared_inputs, inputs, strict=True):
        shape = tuple(feature.type.multiArrayType.shape)
        if not feature.name or shape != tuple(tensor.shape):
            raise InfeasibleConfig(
                f"Core ML input {feature.name!r} has shape {shape}, the spec's example is {tuple(tensor.shape)}"
            )
    if len(declared_outputs) != len(reference):
        raise InfeasibleConfig(f"the Core ML model has {len(declared_outputs)} outputs, torch gives {len(reference)}")
    for feature, tensor in zip(declared_outputs, reference, strict=True):
        shape = tuple(feature.type.multiArrayType.shape)
        if not feature.name or (shape and shape != tuple(tensor.shape)):
            raise InfeasibleConfig(
                f"Core ML output {feature.name!r} has shape {shape}, torch gives {tuple(tensor.shape)}"
            )
    names = [f.name for f in declared_outputs]
    if len(set(names)) != len(names):
        raise InfeasibleConfig(f"Core ML output names are not unique: {names}")
    if RECIPE_KEY not in reloaded.user_defined_metadata:
        raise InfeasibleConfig("the reloaded Core ML package lost its recipe metadata")
    return names


def _predict_and_compare(
    ct: ModuleType,
    path: Path,
    config: CoreMLExportConfig,
    inputs: Batch,
    reference: list[Tensor],
    output_names: list[str],
    lossy: bool,
) -> OutputComparison:
    """Run Core ML (macOS only) on the example inputs and compare with torch."""

    model = ct.models.MLModel(str(path), compute_units=getattr(ct.ComputeUnit, config.compute_units))
    input_names = [f.name for f in model.get_spec().description.input]
    feed = {
        name: t.numpy().astype(np.float32 if t.is_floating_point() else np.int32)
        for name, t in zip(input_names, inputs, strict=True)
    }
    try:
        predicted = model.predict(feed)
    except Exception as exc:
        raise converter_failure("Core ML prediction", exc) from exc
    candidate = [torch.from_numpy(np.asarray(predicted[name], dtype=np.float32)) for name in output_names]
    comparison = compare_outputs(reference, candidate)
    require_close(comparison, lossy, "Core ML prediction")
    return comparison


def _describe_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {op}" for op, n in counts.items()) if counts else "none"
