"""What of a recipe's numerics each exported runtime reproduces: one table for ONNX Runtime and OpenVINO.

ONNX Runtime and OpenVINO both run the *float* graph and re-apply the recipe's numeric stages with
their own toolkits (onnxruntime's quantization; NNCF and OpenVINO's inference precision). Each row of
:data:`MIRROR_TABLE` is one numeric fact a recipe can hold (from its merged
:class:`~pipeline.core.mirror.ExportMirror`) and says, per runtime, None when that runtime reproduces
it, else why not. The runtimes' checks before a chain runs (``unmirrored``), the ONNX export's int8
step (:mod:`stages.export.onnx_int8`) and the OpenVINO export (:mod:`stages.export.openvino_export`)
all read this table, so a recipe is ruled out for the same reason everywhere.

A recipe's AMP float32 layers are known only once the amp stage has calibrated them (the resolved
config lists them; a requested config says None): before the chain runs, AMP counts as whole-model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pipeline.core.mirror import ExportMirror

ExportedRuntimeName = Literal["onnxruntime", "openvino"]


@dataclass(frozen=True)
class MirrorRule:
    """One numeric fact and whether each exported runtime reproduces it (None) or why not (text; ``{method}``
    and ``{dtype}`` are filled from the recipe)."""

    fact: str
    holds: Callable[[ExportMirror], bool]
    onnxruntime: str | None
    openvino: str | None

    def reason(self, runtime: ExportedRuntimeName, mirror: ExportMirror) -> str | None:
        """Why ``runtime`` does not reproduce this fact of ``mirror`` (None: it does, or the fact does not hold)."""
        if not self.holds(mirror):
            return None
        why = self.onnxruntime if runtime == "onnxruntime" else self.openvino
        return None if why is None else why.format(method=mirror.quant_method, dtype=mirror.amp_dtype)


def _not_int8(mirror: ExportMirror) -> bool:
    return mirror.quant_method is not None and mirror.quant_bits != 8


def _int8(activations: str) -> Callable[[ExportMirror], bool]:
    def holds(mirror: ExportMirror) -> bool:
        return mirror.quant_method is not None and mirror.quant_bits == 8 and mirror.quant_activations == activations

    return holds


def _amp(dtypes: tuple[str, ...]) -> Callable[[ExportMirror], bool]:
    return lambda mirror: mirror.amp_dtype in dtypes


#: The one table: every numeric fact of a recipe and what each exported runtime does with it.
MIRROR_TABLE: tuple[MirrorRule, ...] = (
    MirrorRule(
        "AMP in bfloat16 (or the device's preferred dtype)", _amp(("bfloat16", "auto")),
        onnxruntime="AMP ({dtype}) is not mirrored: the graph would compute in float32",
        openvino=None,  # INFERENCE_PRECISION_HINT bf16, where the device's OpenVINO plugin runs bf16
    ),
    MirrorRule(
        "AMP in float16", _amp(("float16",)),
        onnxruntime="AMP ({dtype}) is not mirrored: the graph would compute in float32",
        openvino="AMP ({dtype}) is not mirrored: OpenVINO's CPU plugin runs f16 only on CPUs with native fp16 "
                 "arithmetic, not wired here (bfloat16 is)",
    ),
    MirrorRule(
        "AMP with layers kept in float32", lambda mirror: mirror.amp_dtype is not None and bool(mirror.fp32_layers),
        onnxruntime=None,  # AMP itself is already a reason above
        openvino="AMP keeps layers in float32 and OpenVINO's inference precision applies to the whole model "
                 "(the IR's disable_fp16_compression marks did not keep ops in float32 under the CPU's bf16)",
    ),
    MirrorRule(
        "quantization that is not int8 (4-bit, float8 weights)", _not_int8,
        onnxruntime="{method} has no ONNX Runtime mirror here (only int8 methods are)",
        openvino="{method} has no OpenVINO mirror here (only int8 methods are: NNCF's 4-bit weight compression "
                 "is not wired to the quantize stage)",
    ),
    MirrorRule(
        "int8 weights, float activations (int8_weight_only)", _int8("float"),
        onnxruntime="{method} keeps activations float, and ONNX Runtime's int8 kernels quantize them too "
                    "(int8_dynamic is its mirror)",
        # nncf.compress_weights (INT8, per output channel), with OpenVINO's CPU dynamic quantization of
        # activations switched off (DYNAMIC_QUANTIZATION_GROUP_SIZE 0): activations stay float as in torchao.
        openvino=None,
    ),
    MirrorRule(
        "int8 weights, activations quantized per call (int8_dynamic)", _int8("dynamic"),
        onnxruntime=None,
        # OpenVINO's only run-time activation quantization is the CPU plugin's dynamic quantization of
        # compressed-weight matmuls, per group of input channels (DYNAMIC_QUANTIZATION_GROUP_SIZE), not
        # torchao's one scale per row; NNCF's static int8 fixes the scales at calibration. Neither is the
        # same numerics, so the trial would measure a different model.
        openvino="{method} quantizes activations per row at run time; OpenVINO has no such int8 (NNCF static "
                 "int8 calibrates fixed scales, the CPU plugin's dynamic quantization scales per group of input "
                 "channels): int8_static_pt2e or int8_weight_only are its mirrors",
    ),
    MirrorRule(
        "int8 weights, activations calibrated ahead (int8_static_pt2e)", _int8("static"),
        onnxruntime=None,  # static QDQ int8 calibrated on the spec's data (stages/export/onnx_int8.py)
        openvino=None,  # nncf.quantize calibrated on the spec's data (stages/export/openvino_nncf.py)
    ),
)


def unmirrored(runtime: ExportedRuntimeName, mirror: ExportMirror) -> list[str]:
    """What of the recipe's numerics ``runtime`` does not reproduce (empty: all of it), stages marked
    not mirrored included."""
    reasons = [why for rule in MIRROR_TABLE if (why := rule.reason(runtime, mirror)) is not None]
    return reasons + list(mirror.not_mirrored)


def ort_unmirrored(mirror: ExportMirror) -> list[str]:
    """What ONNX Runtime does not reproduce of the recipe (:data:`MIRROR_TABLE`)."""
    return unmirrored("onnxruntime", mirror)


def ov_unmirrored(mirror: ExportMirror) -> list[str]:
    """What OpenVINO does not reproduce of the recipe (:data:`MIRROR_TABLE`)."""
    return unmirrored("openvino", mirror)


def float_graph_unmirrored(runtime: ExportedRuntimeName, mirror: ExportMirror) -> list[str]:
    """What ``runtime`` does not reproduce when its export leaves quantization out (``quantize="none"``):
    the table's rules on AMP, and stages marked not mirrored."""
    return unmirrored(runtime, ExportMirror(amp_dtype=mirror.amp_dtype, fp32_layers=mirror.fp32_layers,
                                            not_mirrored=mirror.not_mirrored))
