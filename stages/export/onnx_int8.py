"""ONNX Runtime's int8, the ONNX mirror of the quantize stage.

The recipe's quantize method decides the ORT method: torch-side dynamic int8 -> ``quantize_dynamic``
(int8 weights per output channel, activations quantized per call); static int8 (PT2E, calibrated)
-> ``quantize_static`` in the QDQ format, calibrated (a high percentile of each activation) on the spec's
calibration batches. The layers it touches are the ones the torch side quantized: the quantize stage's
layer filter (:class:`~paretorch.stages.export.layer_filter.LayerFilter`), with the layers its float fallback kept
float left float here too. What ORT cannot reproduce (4-bit and float8 weights, int8 weight-only, AMP, any
stage marked not mirrored) is a note on the file, or with ``unmirrored="infeasible"`` (the
``onnxruntime`` runtime, which must never measure a float model in place of a quantized one) an
infeasible config with the reason.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from paretorch.pipeline.core.device import int8_products_saturate
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.runtimes.onnxruntime import ONNXRUNTIME
from paretorch.pipeline.core.spec import Batch
from paretorch.stages.common.mirror_facts import WeightQuantization
from paretorch.stages.export.checks import converter_failure
from paretorch.stages.export.layer_filter import LayerFilter, module_weight_key

if TYPE_CHECKING:
    import onnx

    from paretorch.stages.export.onnx import ONNXExportConfig

#: ONNX op types of the layer kinds a quantization touches.
ONNX_OP_TYPES = {"linear": ("MatMul", "Gemm"), "conv": ("Conv",)}
#: Ops of a quantized graph: dynamic int8 (integer matmuls) and static QDQ (dequantized int8 weights).
INT8_OP_TYPES = frozenset({"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "DynamicQuantizeMatMul",
                           "DequantizeLinear"})
#: Ops that pass a layer's output on unchanged enough that the layer still counts as the head.
PASS_THROUGH_OPS = frozenset({"Add", "Cast", "Reshape", "Identity"})

Int8Mode = Literal["dynamic", "static"]
#: Static int8's activation range: this percentile of the calibration data's absolute values.
CALIBRATION_PERCENTILE = 99.9999


@dataclass(frozen=True)
class Int8Plan:
    """Whether and how the float ONNX graph gets int8 (``layer_filter`` None: it does not)."""

    layer_filter: LayerFilter | None = None
    mode: Int8Mode = "dynamic"
    symmetric: bool = True
    note: str = ""


def int8_plan(config: ONNXExportConfig, upstream: ExportMirror, protected: tuple[str, ...]) -> Int8Plan:
    """Decide the int8 step from ``config.quantize`` and the recipe (``protected``: the spec's layers);
    with ``config.unmirrored == "infeasible"`` a numeric stage ORT cannot reproduce raises
    :class:`InfeasibleConfig`."""
    if config.unmirrored == "infeasible":
        exported = upstream if config.quantize == "mirror" else upstream.without(WeightQuantization)
        reasons = ONNXRUNTIME.reproduces.refusals(exported)
        if reasons:
            raise InfeasibleConfig(f"ONNX Runtime cannot run this recipe as trained: {'; '.join(reasons)} "
                                   "(run it with a torch runtime, or change the recipe)")
    quant = upstream.of(WeightQuantization)
    if config.quantize == "none":
        return Int8Plan(note="not quantized (quantize='none')" if quant is not None else "")
    if config.quantize == "int8_dynamic":
        layer_filter = LayerFilter(kinds=("linear",), min_weight_elements=0, skip_head=False, protected=protected)
        note = "int8 dynamic quantization (quantize='int8_dynamic'), every linear layer not protected by the spec"
        return Int8Plan(layer_filter=layer_filter, note=note)
    if quant is not None and quant.bits == 8:
        layer_filter = LayerFilter.from_upstream(upstream, protected, default_min_elements=0)
        mapping = "symmetric" if quant.symmetric else "asymmetric"
        if quant.activations == "static":
            note = (f"{quant.method} mirrored: onnxruntime static int8 (QDQ on each layer's input and "
                    f"weight, outputs float; activation ranges at the {CALIBRATION_PERCENTILE}th percentile of the "
                    f"spec's calibration data), per-channel {mapping} weights")
            return Int8Plan(layer_filter=layer_filter, mode="static", symmetric=quant.symmetric, note=note)
        note = f"{quant.method} mirrored: onnxruntime dynamic int8, per-channel {mapping} weights"
        return Int8Plan(layer_filter=layer_filter, symmetric=quant.symmetric, note=note)
    if quant is not None:
        return Int8Plan(note=f"{quant.method} not mirrored in ONNX (only int8 methods are)")
    return Int8Plan()


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


class CalibrationReader:
    """The spec's calibration batches as onnxruntime's ``CalibrationDataReader`` reads them
    (``get_next() -> {input name: array} | None``; ``rewind()`` starts over)."""

    def __init__(self, input_names: Sequence[str], batches: Sequence[Batch]) -> None:
        self.feeds = [{name: t.detach().cpu().numpy() for name, t in zip(input_names, batch, strict=True)}
                      for batch in batches]
        self._iter: Iterator[dict[str, Any]] = iter(self.feeds)

    def get_next(self) -> dict[str, Any] | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self.feeds)


def quantize_int8(graph: onnx.ModelProto, plan: Int8Plan, nodes: list[str], output: Path,
                  calibration: Sequence[Batch]) -> onnx.ModelProto:
    """int8 of ``nodes`` (per-channel weights) into ``output``, dynamic or static QDQ as ``plan`` says;
    returns the loaded result."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    if plan.layer_filter is None:
        raise ValueError("quantize_int8 needs a plan with a layer filter (int8_plan gave none)")
    op_types = sorted({op for kind in plan.layer_filter.kinds for op in ONNX_OP_TYPES[kind]})
    prepared = output.with_name("prepared.onnx")
    onnx.save(graph, str(prepared))
    options: dict[str, Any] = {"WeightSymmetric": plan.symmetric}
    # 7-bit weights where u8 x s8 products saturate (an x86 CPU without VNNI: int8_products_saturate).
    reduce_range = int8_products_saturate()
    try:
        if plan.mode == "static":
            if not calibration:
                raise InfeasibleConfig("static int8 in ONNX Runtime needs calibration batches: the spec has none")
            reader = CalibrationReader([i.name for i in graph.graph.input], calibration)
            # uint8 activations with int8 weights: the x86 VNNI kernels' format (onnxruntime's default for QDQ).
            # Only a layer's input and weight get QDQ, as the torch side (X86InductorQuantizer) quantizes a
            # linear: onnxruntime's QDQ also quantizes a MatMul's output by default, and that extra per-tensor
            # uint8 rounding (before the bias and the residual add) cost MiniLM cosine 0.912 -> 0.985 without it.
            options["OpTypesToExcludeOutputQuantization"] = op_types
            # Activation ranges: the 99.9999th percentile of |x| from a histogram (onnxruntime's Percentile
            # calibration, a range symmetric about 0 by default), not min/max: on MiniLM min/max scored
            # 43.50 on the word task, this 44.17 (fp32 44.33), the cosine to fp32 about the same (0.985, 0.987).
            options |= {"CalibPercentile": CALIBRATION_PERCENTILE}
            with contextlib.redirect_stdout(io.StringIO()):  # its calibrator print()s progress: dropped
                quantize_static(str(prepared), str(output), reader, quant_format=QuantFormat.QDQ,
                                op_types_to_quantize=op_types, nodes_to_quantize=nodes, per_channel=True,
                                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                                calibrate_method=CalibrationMethod.Percentile, reduce_range=reduce_range,
                                extra_options=options)
        else:
            quantize_dynamic(str(prepared), str(output), op_types_to_quantize=op_types, nodes_to_quantize=nodes,
                             per_channel=True, weight_type=QuantType.QInt8, reduce_range=reduce_range,
                             extra_options=options)
        return onnx.load(str(output))
    except InfeasibleConfig:
        raise
    except Exception as exc:  # onnxruntime raises plain Exceptions / ValueError / onnx errors
        raise converter_failure(f"onnxruntime {plan.mode} int8 quantization", exc) from exc


def count_int8_ops(graph: onnx.ModelProto) -> int:
    return sum(1 for node in graph.graph.node if node.op_type in INT8_OP_TYPES)
