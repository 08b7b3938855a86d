"""ONNX export: torch.onnx (dynamo) of the float graph, int8 mirror with onnxruntime, validation and metrics.

The artifact is one self-contained ``<spec name>.onnx`` (weights embedded, so
models up to protobuf's 2 GB limit). With ``quantize="mirror"`` the recipe's
int8 methods are mirrored with ``onnxruntime.quantization.quantize_dynamic``
(int8 weights per output channel, symmetric or asymmetric as the recipe's
``mapping``, on the layer kinds the torch side quantized); 4-bit and float8
methods, AMP and sparsity are not mirrored and the validation text says so.
The file is checked with onnxruntime (CPUExecutionProvider) against torch and
measured: spec metric on the evaluation split and median latency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from pipeline.core.errors import InfeasibleConfig
from pipeline.core.evaluate import LatencySettings, compute_metric, measure_latency
from pipeline.core.mirror import ExportMirror
from pipeline.core.padding import is_token_input
from pipeline.core.spec import Batch
from pipeline.core.stage import ExportResult, StageContext, export_mirror
from stages.export.atomic import artifact_size_bytes, atomic_artifact
from stages.export.checks import (
    CPU,
    compare_outputs,
    converter_failure,
    cpu_inputs,
    float_graph_on_cpu,
    require_close,
    run_reference,
)
from stages.export.layer_filter import LayerFilter, module_weight_key, untraced_protected
from stages.export.metadata import artifact_metadata

if TYPE_CHECKING:
    import onnx
    import onnxruntime

    from stages.export.onnx import ONNXExportConfig

#: ONNX op types of the layer kinds a quantization touches.
ONNX_OP_TYPES = {"linear": ("MatMul", "Gemm"), "conv": ("Conv",)}
INT8_OP_TYPES = frozenset({"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv"})


#: Ops that pass a layer's output on unchanged enough that the layer still counts as the head.
PASS_THROUGH_OPS = frozenset({"Add", "Cast", "Reshape", "Identity"})


@dataclass(frozen=True)
class Int8Plan:
    """Whether and how the float ONNX graph gets int8 weights (``layer_filter`` None: it does not)."""

    layer_filter: LayerFilter | None = None
    symmetric: bool = True
    note: str = ""


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
    notes += _unmirrored_notes(upstream)
    name = f"{ctx.spec.name}.onnx"
    with atomic_artifact(output_dir, name) as staged:
        graph = _export_float_graph(float_model, inputs, config, staged.with_name("float.onnx"))
        quantized = False
        if plan.layer_filter is not None:
            selected, skipped = select_nodes(graph, plan.layer_filter)
            float_layers = ", ".join(f"{weight} ({why})" for weight, why in skipped.items()) or "none"
            if selected:
                graph = _quantize_int8(graph, plan.layer_filter, plan.symmetric, selected, staged)
                quantized = True
                notes.append(f"{plan.note} ({_count_int8_ops(graph)} int8 ops; float: {float_layers})")
            else:
                notes.append(f"int8 not applied: no layer of the graph passes the quantize filter ({float_layers})")
            untraced = untraced_protected(plan.layer_filter, list(skipped.values()))
            if untraced:
                notes.append(f"protected layers not traced to an ONNX weight: {', '.join(untraced)}")
        elif plan.note:
            notes.append(plan.note)
        _save_with_metadata(graph, staged, artifact_metadata(ctx.upstream, "onnx", "onnxruntime", "onnxscript"))
        runner = OrtRunner(_session(staged), fixed_batch)
        comparison = compare_outputs(reference, runner.outputs(inputs))
        require_close(comparison, lossy=quantized, what="onnxruntime output")
        notes.append(f"onnxruntime (CPU) matches torch: {comparison.describe()}")
        metrics = {"onnx_max_abs_error": comparison.max_abs_error, "onnx_cosine": comparison.cosine}
        metrics.update(_measure(runner, ctx, config, fixed_batch))
    path = output_dir / name
    return ExportResult(
        format="onnx",
        path=path,
        size_bytes=artifact_size_bytes(path),
        validation="; ".join(notes),
        metrics=metrics,
    )


def int8_plan(config: ONNXExportConfig, upstream: ExportMirror, protected: tuple[str, ...]) -> Int8Plan:
    """Decide the int8 step from ``config.quantize`` and the recipe (``protected``: the spec's layers)."""
    if config.quantize == "none":
        return Int8Plan(note="not quantized (quantize='none')" if upstream.quant_method else "")
    if config.quantize == "int8_dynamic":
        layer_filter = LayerFilter(kinds=("linear",), min_weight_elements=0, skip_head=False, protected=protected)
        note = "int8 dynamic quantization (quantize='int8_dynamic'), every linear layer not protected by the spec"
        return Int8Plan(layer_filter=layer_filter, note=note)
    if upstream.quant_bits == 8:
        mapping = "symmetric" if upstream.quant_symmetric else "asymmetric"
        layer_filter = LayerFilter.from_upstream(upstream, protected, default_min_elements=0)
        note = f"{upstream.quant_method} mirrored: onnxruntime dynamic int8, per-channel {mapping} weights"
        return Int8Plan(layer_filter=layer_filter, symmetric=upstream.quant_symmetric, note=note)
    if upstream.quant_method is not None:
        return Int8Plan(note=f"{upstream.quant_method} not mirrored in ONNX (only int8 methods are)")
    return Int8Plan()


def _unmirrored_notes(upstream: ExportMirror) -> list[str]:
    notes = []
    if upstream.amp_dtype is not None:
        notes.append(f"AMP ({upstream.amp_dtype}) not mirrored: the graph computes in float32")
    if upstream.unstructured_sparsity:
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
    # The exporter annotates initializers with value_info; onnxruntime's quantizer
    # transposes Gemm weights and then fails shape inference on those annotations.
    initializers = {init.name for init in graph.graph.initializer}
    kept = [info for info in graph.graph.value_info if info.name not in initializers]
    del graph.graph.value_info[:]
    graph.graph.value_info.extend(kept)
    return graph


def select_nodes(graph: onnx.ModelProto, layer_filter: LayerFilter) -> tuple[list[str], dict[str, str]]:
    """Names of the nodes whose constant weight the int8 step quantizes, and why the others stay float."""

    initializers = {init.name: init for init in graph.graph.initializer}
    outputs = {out.name for out in graph.graph.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    op_types = {op for kind in layer_filter.kinds for op in ONNX_OP_TYPES[kind]}
    selected: list[str] = []
    skipped: dict[str, str] = {}
    for node in graph.graph.node:
        weight = initializers.get(node.input[1]) if node.op_type in op_types and len(node.input) > 1 else None
        if weight is None:
            continue
        dims = list(weight.dims)
        is_head = any(
            out in outputs
            or any(c.op_type in PASS_THROUGH_OPS and set(c.output) & outputs for c in consumers.get(out, []))
            for out in node.output
        )
        reason = layer_filter.skip_reason(
            module_weight_key(weight.name),
            elements=math.prod(dims),
            input_size=dims[1] if len(dims) > 1 else dims[0],
            is_head=is_head,
        )
        if reason is None:
            selected.append(node.name)
            if node.op_type == "Gemm":  # onnxruntime's quantizer rewrites Gemm as "<name>_MatMul" + "<name>_Add"
                selected.append(f"{node.name}_MatMul")
        else:
            skipped[weight.name] = reason
    return selected, skipped


def _quantize_int8(
    graph: onnx.ModelProto, layer_filter: LayerFilter, symmetric: bool, nodes: list[str], output: Path
) -> onnx.ModelProto:
    """``quantize_dynamic`` of ``nodes`` (int8 per-channel weights) into ``output``; returns the loaded result."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    op_types = sorted({op for kind in layer_filter.kinds for op in ONNX_OP_TYPES[kind]})
    prepared = output.with_name("prepared.onnx")
    onnx.save(graph, str(prepared))
    try:
        quantize_dynamic(
            str(prepared),
            str(output),
            op_types_to_quantize=op_types,
            nodes_to_quantize=nodes,
            per_channel=True,
            weight_type=QuantType.QInt8,
            extra_options={"WeightSymmetric": symmetric},
        )
        return onnx.load(str(output))
    except Exception as exc:  # onnxruntime raises plain Exceptions / ValueError / onnx errors
        raise converter_failure("onnxruntime int8 quantization", exc) from exc


def _count_int8_ops(graph: onnx.ModelProto) -> int:
    return sum(1 for node in graph.graph.node if node.op_type in INT8_OP_TYPES)


def _save_with_metadata(graph: onnx.ModelProto, path: Path, metadata: dict[str, str]) -> None:
    import onnx

    existing = {prop.key: prop.value for prop in graph.metadata_props}
    onnx.helper.set_model_props(graph, {**existing, **metadata})
    onnx.save(graph, str(path))


# --------------------------------------------------------------------------- running


def _session(path: Path) -> onnxruntime.InferenceSession:
    import onnxruntime

    try:
        return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own exception types (Fail, InvalidGraph, ...)
        raise converter_failure("loading the ONNX file in onnxruntime", exc) from exc


class OrtRunner:
    """Calls an onnxruntime session like a torch model: ``runner(*tensors) -> first output``.

    With a fixed batch size, inputs are run in chunks of that size (the last one
    padded by repeating its final row) and the outputs trimmed back.
    """

    def __init__(self, session: onnxruntime.InferenceSession, fixed_batch: int | None) -> None:
        self.session = session
        self.input_names = [i.name for i in session.get_inputs()]
        self.fixed_batch = fixed_batch

    def outputs(self, inputs: Batch) -> list[Tensor]:
        """All outputs as float32 CPU tensors."""
        if len(inputs) != len(self.input_names):
            raise InfeasibleConfig(f"the ONNX graph takes {len(self.input_names)} inputs, the spec gives {len(inputs)}")
        if self.fixed_batch is None:
            return self._run(inputs)
        rows = int(inputs[0].shape[0])
        chunks: list[list[Tensor]] = []
        for start in range(0, rows, self.fixed_batch):
            chunk = tuple(_pad_rows(t[start : start + self.fixed_batch], self.fixed_batch) for t in inputs)
            chunks.append([out[: min(self.fixed_batch, rows - start)] for out in self._run(chunk)])
        return [torch.cat(parts) for parts in zip(*chunks, strict=True)]

    def __call__(self, *inputs: Tensor) -> Tensor:
        return self.outputs(inputs)[0]

    def _run(self, inputs: Sequence[Tensor]) -> list[Tensor]:
        feed: dict[str, Any] = {
            name: t.detach().cpu().numpy() for name, t in zip(self.input_names, inputs, strict=True)
        }
        try:
            results = self.session.run(None, feed)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise converter_failure("onnxruntime inference", exc) from exc
        return [torch.from_numpy(result).to(torch.float32) for result in results]


def _pad_rows(tensor: Tensor, rows: int) -> Tensor:
    missing = rows - int(tensor.shape[0])
    if missing <= 0:
        return tensor
    return torch.cat([tensor, tensor[-1:].expand(missing, *tensor.shape[1:])])


def _measure(
    runner: OrtRunner, ctx: StageContext, config: ONNXExportConfig, fixed_batch: int | None
) -> dict[str, float]:
    """The spec metric over the evaluation split and latency p50 per batch size, with onnxruntime."""
    metric = ctx.spec.metric
    metrics = {f"onnx_{metric.name}": compute_metric(runner, ctx.spec.evaluation(), metric, CPU)}
    if config.measure_latency:
        batch_sizes = ctx.spec.latency_batch_sizes if fixed_batch is None else (fixed_batch,)
        for batch_size in batch_sizes:
            stats = measure_latency(runner, cpu_inputs(ctx.spec, batch_size), CPU, LatencySettings())
            metrics[f"onnx_latency_ms_p50_b{batch_size}"] = stats.p50_ms
    return metrics
