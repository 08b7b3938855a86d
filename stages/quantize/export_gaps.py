"""Which exported runtimes reproduce a quantization method, and why not where they do not.

ONNX Runtime and OpenVINO run the *float* graph and re-apply the recipe's quantization with their own
toolkits (onnxruntime's int8 quantization, :mod:`stages.export.onnx_int8`; NNCF, :mod:`stages.export.openvino_nncf`).
The quantize stage hands these gaps to the exports with its mirror facts, so a recipe is ruled out for the
same reason by the runtime's check before the chain runs and by the export itself.
"""

from __future__ import annotations

from pipeline.core.mirror import RuntimeGap
from stages.quantize.methods import QuantMethod


def runtime_gaps(method: QuantMethod) -> tuple[RuntimeGap, ...]:
    """The exported runtimes that cannot reproduce ``method``, each with why."""
    name = method.name
    if method.weight_bits != 8:  # 4-bit and float8 weights
        return (
            RuntimeGap("onnxruntime", f"{name} has no ONNX Runtime mirror here (only int8 methods are)"),
            RuntimeGap("openvino", f"{name} has no OpenVINO mirror here (only int8 methods are: NNCF's 4-bit "
                                   "weight compression is not wired to the quantize stage)"),
        )
    if method.activations == "float":
        # OpenVINO: nncf.compress_weights (INT8, per output channel), with the CPU plugin's dynamic quantization
        # of activations switched off (DYNAMIC_QUANTIZATION_GROUP_SIZE 0): activations stay float as in torchao.
        return (RuntimeGap("onnxruntime", f"{name} keeps activations float, and ONNX Runtime's int8 kernels "
                                          "quantize them too (int8_dynamic is its mirror)"),)
    if method.activations == "dynamic":
        # OpenVINO's only run-time activation quantization is the CPU plugin's dynamic quantization of
        # compressed-weight matmuls, per group of input channels (DYNAMIC_QUANTIZATION_GROUP_SIZE), not
        # torchao's one scale per row; NNCF's static int8 fixes the scales at calibration. Neither is the
        # same numerics, so the trial would measure a different model.
        return (RuntimeGap("openvino", f"{name} quantizes activations per row at run time; OpenVINO has no such "
                                       "int8 (NNCF static int8 calibrates fixed scales, the CPU plugin's dynamic "
                                       "quantization scales per group of input channels): int8_static_pt2e or "
                                       "int8_weight_only are its mirrors"),)
    # Static int8: ONNX Runtime's static QDQ int8 and nncf.quantize, both calibrated on the spec's data.
    return ()
