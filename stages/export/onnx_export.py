"""ONNX export: torch.onnx (dynamo) of the float graph, int8 mirror with onnxruntime, validation and metrics.

The artifact is one self-contained ``<spec name>.onnx`` (weights embedded, so
models up to protobuf's 2 GB limit), the file a user deploys with plain
``onnxruntime.InferenceSession(path)``. Token models get ONNX Runtime's fused
transformer ops, matched in the dynamo graph by onnxscript
(:mod:`paretorch.stages.export.onnx_fusions`); with ``quantize="mirror"`` the recipe's int8 methods
are mirrored with onnxruntime's quantization (:mod:`paretorch.stages.export.onnx_int8`: dynamic,
or static QDQ calibrated on the spec's data, on the layers the torch side quantized);
4-bit and float8 methods, AMP and sparsity are not mirrored and the
validation text says so (or, for the ``onnxruntime`` runtime, the export is infeasible).
The file is checked with onnxruntime (CPUExecutionProvider) against torch and
measured: spec metric on the evaluation split and median latency.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.ort_session import OrtModel, open_session
from paretorch.pipeline.core.spec import Batch
from paretorch.pipeline.core.stage import ExportResult, StageContext, export_mirror
from paretorch.pipeline.core.token_inputs import is_token_input
from paretorch.stages.common.mirror_facts import ReducedPrecision, Sparsity
from paretorch.stages.export.atomic import artifact_size_bytes, atomic_artifact
from paretorch.stages.export.checks import (
    CPU,
    compare_outputs,
    converter_failure,
    cpu_inputs,
    file_measures,
    float_graph_on_cpu,
    grouped_mask_input,
    grouped_note,
    require_close,
    run_reference,
)
from paretorch.stages.export.layer_filter import untraced_protected
from paretorch.stages.export.metadata import artifact_metadata
from paretorch.stages.export.onnx_fusions import transformer_fusions
from paretorch.stages.export.onnx_int8 import count_int8_ops, int8_plan, quantize_int8, select_nodes
from paretorch.stages.export.onnx_residual_order import residual_before_bias

if TYPE_CHECKING:
    import onnx

    from paretorch.stages.export.onnx import ONNXExportConfig


def export_onnx(model: nn.Module, config: ONNXExportConfig, ctx: StageContext) -> ExportResult:
    """Write ``<spec name>.onnx`` under ``ctx.output_dir``, validated with onnxruntime."""
    output_dir = ctx.require_output_dir()
    upstream = export_mirror(ctx.upstream)
    float_model = float_graph_on_cpu(model, ctx)
    fixed_batch = None if config.dynamic_batch else config.batch_size
    inputs = cpu_inputs(ctx.spec, fixed_batch or 2)
    reference = run_reference(float_model, inputs)
    plan = int8_plan(config, upstream, ctx.spec.protected_layers)
    shape_note = "dynamic batch" if fixed_batch is None else f"fixed batch {fixed_batch}"
    notes = [f"exported with torch.onnx (dynamo), opset {config.opset}, {shape_note}"]
    grouped_input = grouped_mask_input(upstream, ctx.spec)
    notes += _unmirrored_notes(upstream) + grouped_note(grouped_input)
    name = f"{ctx.spec.name}.onnx"
    with atomic_artifact(output_dir, name) as staged:
        float_path = staged.with_name("float.onnx")
        graph = _export_float_graph(float_model, inputs, config, float_path)
        fusions = _wants_fusions(config, inputs)
        ctx.resolve(config.model_copy(update={"fusions": "bert" if fusions else "none"}))  # what ran, not "auto"
        if fusions:
            graph, fusion_note = transformer_fusions(float_path)
            _drop_initializer_value_info(graph)
            notes.append(fusion_note)
        if reordered := residual_before_bias(graph):
            notes.append(f"{reordered} residual add(s) before their bias (keeps ORT's slow SkipLayerNormalization off)")
        quantized = False
        if plan.layer_filter is not None:
            selected, skipped = select_nodes(graph, plan.layer_filter)
            float_layers = ", ".join(f"{weight} ({why})" for weight, why in skipped.items()) or "none"
            if selected:
                graph = quantize_int8(graph, plan, selected, staged, ctx.spec.calibration() if
                                      plan.mode == "static" else [])
                quantized = True
                notes.append(f"{plan.note} ({count_int8_ops(graph)} int8 ops; float: {float_layers})")
            else:
                notes.append(f"int8 not applied: no layer of the graph passes the quantize filter ({float_layers})")
            untraced = untraced_protected(plan.layer_filter, list(skipped.values()))
            if untraced:
                notes.append(f"protected layers not traced to an ONNX weight: {', '.join(untraced)}")
        elif plan.note:
            notes.append(plan.note)
        _save_with_metadata(graph, staged, artifact_metadata(ctx.upstream, "onnx", "onnxruntime", "onnxscript"))
        runner = _session(staged)
        runner.fixed_batch = fixed_batch
        comparison = compare_outputs(reference, runner.outputs(inputs))
        notes.append(require_close(comparison, lossy=quantized, what="onnxruntime (CPU)", spec=ctx.spec))
        metrics = {"onnx_max_abs_error": comparison.max_abs_error, "onnx_cosine": comparison.cosine}
        metrics.update(file_measures(runner, ctx, "onnx", config.measure_metric, config.measure_latency,
                                     ctx.timed_batch_sizes() if fixed_batch is None else (fixed_batch,)))
    path = output_dir / name
    return ExportResult(
        format="onnx",
        path=path,
        size_bytes=artifact_size_bytes(path),
        validation="; ".join(notes),
        metrics=metrics,
        grouped_mask_input=grouped_input,
    )


def _unmirrored_notes(upstream: ExportMirror) -> list[str]:
    notes = []
    if (amp := upstream.of(ReducedPrecision)) is not None:
        notes.append(f"AMP ({amp.dtype}) not mirrored: the graph computes in float32")
    if upstream.of(Sparsity) is not None:
        notes.append("pruned zeros stored dense")
    notes.extend(f"not mirrored: {note}" for note in upstream.not_mirrored)
    return notes


# --------------------------------------------------------------------------- writing


def _export_float_graph(model: nn.Module, inputs: Batch, config: ONNXExportConfig, path: Path) -> onnx.ModelProto:
    """torch.onnx.export(dynamo=True) with embedded weights; returns the loaded graph."""
    import onnx

    dynamic_shapes = None
    if config.dynamic_batch:
        batch = torch.export.Dim("batch", min=1)
        # token inputs also vary in length (batches padded to their longest): their dim 1 stays dynamic
        dynamic_shapes = tuple(({0: batch, 1: torch.export.Dim.AUTO} if is_token_input(t) else {0: batch})
                               if t.dim() > 0 else None for t in inputs)
    try:
        torch.onnx.export(
            model,
            inputs,
            str(path),
            dynamo=True,
            opset_version=config.opset,
            external_data=False,
            dynamic_shapes=dynamic_shapes,
            verbose=False,
        )
        graph = onnx.load(str(path))
    except Exception as exc:  # exporter errors come as many types (torch._dynamo, onnxscript, onnx)
        raise converter_failure("ONNX export (torch.onnx, dynamo)", exc) from exc
    _drop_initializer_value_info(graph)
    return graph


def _drop_initializer_value_info(graph: onnx.ModelProto) -> None:
    """The exporter annotates initializers with value_info; onnxruntime's quantizer transposes
    Gemm weights and then fails shape inference on those annotations: drop them."""
    initializers = {init.name for init in graph.graph.initializer}
    kept = [info for info in graph.graph.value_info if info.name not in initializers]
    del graph.graph.value_info[:]
    graph.graph.value_info.extend(kept)


def _wants_fusions(config: ONNXExportConfig, inputs: Batch) -> bool:
    """``fusions="auto"``: the BERT fusions for models that take token inputs."""
    if config.fusions == "auto":
        return any(is_token_input(t) for t in inputs)
    return config.fusions == "bert"


def _save_with_metadata(graph: onnx.ModelProto, path: Path, metadata: dict[str, str]) -> None:
    import onnx

    existing = {prop.key: prop.value for prop in graph.metadata_props}
    onnx.helper.set_model_props(graph, {**existing, **metadata})
    onnx.save(graph, str(path))


# --------------------------------------------------------------------------- running


def _session(path: Path) -> OrtModel:
    """The file in onnxruntime on the CPU (the export's check; the runtime opens its own session)."""
    return open_session(path, CPU)
