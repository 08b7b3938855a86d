"""ONNX Runtime's fused transformer kernels, matched offline in the exported float graph by onnxscript.

The graph comes from ``torch.onnx.export(dynamo=True)``; its rewrites into ORT's contrib ops (domain
``com.microsoft``) are onnxscript's ORT fusions (``onnxscript.rewriter.ort_fusions``, written for dynamo
graphs): ``MultiHeadAttention`` (the decomposed ``scaled_dot_product_attention`` with its scale, mask
bias and the Q/K/V biases) and ``BiasGelu``. Nothing but the file is needed (no download, no config).

Not ``SkipLayerNormalization`` (residual Add + LayerNormalization): on ORT's CPU provider that kernel is
about 8x slower than the two ops it replaces (:mod:`paretorch.stages.export.onnx_residual_order`, which also keeps
ORT's own session-level fusion from making it).

Why not ``onnxruntime.transformers.optimizer.optimize_model(model_type="bert")``: its patterns were
written for the TorchScript exporter, and on a dynamo export of MiniLM it fused only BiasGelu. Its
attention patterns expect the K transpose as one 4-D Transpose and the mask as ``Mul(Sub(1, mask))``;
dynamo writes SDPA's math form (K transposed through Reshape/Transpose/Reshape, the scale as a
constant Mul on both Q and K, a boolean mask through ``Where``, ``IsNaN``/``Where`` after the Softmax).
Giving it the real ``num_heads``/``hidden_size`` changes nothing.

The Q/K/V projections stay separate MatMuls with their constant weights (MultiHeadAttention, not the
packed ``Attention`` op of ``optimize_for_ort``): the int8 step (:mod:`paretorch.stages.export.onnx_int8`)
quantizes MatMuls with initializer weights, and a packed QKV weight (a Concat, with
``qkv_hidden_sizes``, which ORT's quantizer leaves float) would keep a quarter of each layer's linear
work in float. On MiniLM (1 thread, batch 32, 61 tokens; residual adds reordered in both) the fused
attention ran 245 ms against 270 ms without it in fp32, 106 against 129 ms in dynamic int8; packed
Attention was as fast in fp32 and slower in int8 (measured before the reorder).

ORT's session-level graph optimizations still run when the file is loaded
(:data:`paretorch.pipeline.core.ort_session.GRAPH_OPTIMIZATION`). Fusions run before int8 (ORT's order).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from paretorch.stages.export.checks import converter_failure

if TYPE_CHECKING:
    import onnx
    import onnx_ir

#: The operator domain of ORT's contrib (fused) ops.
ORT_DOMAIN = "com.microsoft"


def transformer_fusions(path: Path) -> tuple[onnx.ModelProto, str]:
    """The graph at ``path`` with ORT's fused transformer ops, and a note of what was fused."""
    import onnx_ir as ir

    try:
        model = ir.load(str(path))
        _fuse(model)
        fused_graph = ir.to_proto(model)
    except Exception as exc:  # rewriter, shape inference and serialization errors come as many types
        raise converter_failure("ORT transformer fusions (onnxscript)", exc) from exc
    counts = Counter(node.op_type for node in fused_graph.graph.node if node.domain == ORT_DOMAIN)
    fused = ", ".join(f"{count} {op}" for op, count in sorted(counts.items())) or "nothing fused"
    return declare_ort_domain(fused_graph), f"ORT transformer fusions (onnxscript): {fused}"


def _fuse(model: onnx_ir.Model) -> None:
    """onnxscript's ``fuse_xformers`` sequence for encoders, in place, stopping at MultiHeadAttention
    (no QKV packing into ``Attention``) and without the decoder-only rules (rotary, GQA, RMS norm)."""
    import onnx_ir.passes.common as common_passes
    from onnxscript import optimizer
    from onnxscript.rewriter.ort_fusions import shape_optimization
    from onnxscript.rewriter.ort_fusions.bias_gelu import fuse_bias_gelu
    from onnxscript.rewriter.ort_fusions.erfgelu import fuse_erfgelu
    from onnxscript.rewriter.ort_fusions.gelu import fuse_gelu
    from onnxscript.rewriter.ort_fusions.mha import fuse_mha1, fuse_mha2
    from onnxscript.rewriter.ort_fusions.mha_bias import fuse_mha_bias
    from onnxscript.rewriter.ort_fusions.mha_scale import fuse_mha_scale
    from onnxscript.rewriter.ort_fusions.sdpa import fuse_sdpa

    # onnxscript's own pre-optimization: shapes, constant folding, shape-computation simplification
    common_passes.ShapeInferencePass()(model)
    optimizer.optimize(model)
    shape_optimization.rules.apply_to_model(model)
    optimizer.optimize(model)
    fuse_erfgelu(model)
    fuse_sdpa(model, apply_shape_inference=True)  # SDPA's decomposed math -> one (onnxscript-domain) SDPA node
    fuse_mha1(model)  # SDPA with its Q/K/V reshapes and transposes -> MultiHeadAttention
    fuse_mha2(model)
    fuse_mha_scale(model)
    fuse_mha_bias(model)  # the Q/K/V projection biases into the MultiHeadAttention node
    fuse_gelu(model)
    fuse_bias_gelu(model)
    optimizer.optimize(model)  # inlines what was matched but not consumed, drops dead nodes


def declare_ort_domain(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with ORT's contrib domain in its opset imports when a node uses it. The fused ops
    (BiasGelu, MultiHeadAttention ...) live there; a rewriter does not always declare it, and
    onnx's shape inference (run by ORT's quantizer) then fails on them ("No opset import for domain")."""
    if any(node.domain == ORT_DOMAIN for node in model.graph.node) and not any(
            entry.domain == ORT_DOMAIN for entry in model.opset_import):
        from onnx import helper

        model.opset_import.append(helper.make_opsetid(ORT_DOMAIN, 1))
    return model
