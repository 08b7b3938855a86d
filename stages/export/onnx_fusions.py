"""ONNX Runtime's transformer fusions, applied offline to the exported float graph.

``onnxruntime.transformers.optimizer.optimize_model(model_type="bert")`` rewrites the subgraphs of
BERT-like encoders into ORT's fused kernels (attention, layer norms with their residual add, GELU
with its bias) and needs nothing but the file (no download). It runs with ``opt_level=0``: the graph
optimizations of onnxruntime itself are applied when a session loads the file
(:data:`pipeline.core.ort_session.GRAPH_OPTIMIZATION`), so the file stays portable across
providers. Fusions run before int8 (ORT's order: optimize, then quantize).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stages.export.checks import converter_failure

if TYPE_CHECKING:
    import onnx

#: The optimizer's model type for encoders of the BERT family (BERT, MiniLM, RoBERTa ...).
BERT_MODEL_TYPE = "bert"
#: The operator domain of ORT's contrib (fused) ops.
ORT_DOMAIN = "com.microsoft"


def transformer_fusions(path: Path) -> tuple[onnx.ModelProto, str]:
    """The graph at ``path`` with ORT's BERT fusions, and a note of what was fused."""
    from onnxruntime.transformers.optimizer import optimize_model

    try:
        optimized = optimize_model(str(path), model_type=BERT_MODEL_TYPE, num_heads=0, hidden_size=0,
                                   opt_level=0, use_gpu=False)
        stats = optimized.get_fused_operator_statistics()
    except Exception as exc:  # the optimizer raises plain Exceptions, onnx errors, KeyError ...
        raise converter_failure("onnxruntime transformer fusions (model_type 'bert')", exc) from exc
    fused = ", ".join(f"{count} {op}" for op, count in sorted(stats.items()) if count) or "nothing fused"
    return declare_ort_domain(optimized.model), f"onnxruntime transformer fusions (bert): {fused}"


def declare_ort_domain(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with ORT's contrib domain in its opset imports when a node uses it. The fused ops
    (BiasGelu, SkipLayerNormalization ...) live there; the optimizer does not always declare it, and
    onnx's shape inference (run by ORT's quantizer) then fails on them ("No opset import for domain")."""
    if any(node.domain == ORT_DOMAIN for node in model.graph.node) and not any(
            entry.domain == ORT_DOMAIN for entry in model.opset_import):
        from onnx import helper

        model.opset_import.append(helper.make_opsetid(ORT_DOMAIN, 1))
    return model
