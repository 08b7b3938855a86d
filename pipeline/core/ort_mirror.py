"""What of a recipe's numerics ONNX Runtime reproduces: the one rule behind the ONNX export's int8
step (:mod:`stages.export.onnx_int8`) and the ``onnxruntime`` runtime's check before a chain runs
(:data:`pipeline.core.runtime.EXPORTED_RUNTIMES`).

ONNX Runtime runs the float graph with its own int8 (dynamic int8, static QDQ int8). It has no
counterpart for AMP (the graph would compute in float32), for 4-bit or float8 weights, or for int8
weight-only (its int8 kernels quantize activations too), nor for a stage marked not mirrored.
"""

from __future__ import annotations

from pipeline.core.mirror import ExportMirror


def ort_unmirrored(mirror: ExportMirror) -> list[str]:
    """What of the recipe's numerics ONNX Runtime does not reproduce (empty: all of it)."""
    reasons = float_graph_unmirrored(mirror)
    method = mirror.quant_method
    if method is not None and mirror.quant_bits != 8:
        reasons.append(f"{method} has no ONNX Runtime mirror here (only int8 methods are)")
    elif method is not None and mirror.quant_activations == "float":
        reasons.append(f"{method} keeps activations float, and ONNX Runtime's int8 kernels quantize them too "
                       "(int8_dynamic is its mirror)")
    return reasons


def float_graph_unmirrored(mirror: ExportMirror) -> list[str]:
    """What a float ONNX graph does not reproduce, quantization aside: AMP and stages marked not mirrored."""
    reasons = [f"AMP ({mirror.amp_dtype}) is not mirrored: the graph would compute in float32"] \
        if mirror.amp_dtype is not None else []
    return reasons + list(mirror.not_mirrored)
