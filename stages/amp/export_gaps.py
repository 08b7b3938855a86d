"""Which exported runtimes reproduce an AMP policy, and why not where they do not.

A recipe's float32 layers are known only once the amp stage has calibrated them (the resolved config
lists them; a requested config says None): before the chain runs, AMP counts as whole-model.
"""

from __future__ import annotations

from pipeline.core.mirror import RuntimeGap


def runtime_gaps(dtype: str, fp32_layers: tuple[str, ...]) -> tuple[RuntimeGap, ...]:
    """The exported runtimes that cannot reproduce AMP in ``dtype`` keeping ``fp32_layers``, each with why."""
    gaps: list[RuntimeGap] = []
    if dtype in ("bfloat16", "auto", "float16"):
        gaps.append(RuntimeGap("onnxruntime", f"AMP ({dtype}) is not mirrored: the graph would compute in float32"))
    # OpenVINO runs bfloat16 through INFERENCE_PRECISION_HINT, where the device's OpenVINO plugin runs bf16.
    if dtype == "float16":
        gaps.append(RuntimeGap("openvino", f"AMP ({dtype}) is not mirrored: OpenVINO's CPU plugin runs f16 only on "
                                           "CPUs with native fp16 arithmetic, not wired here (bfloat16 is)"))
    if fp32_layers:
        gaps.append(RuntimeGap("openvino", "AMP keeps layers in float32 and OpenVINO's inference precision applies "
                                           "to the whole model (the IR's disable_fp16_compression marks did not keep "
                                           "ops in float32 under the CPU's bf16)"))
    return tuple(gaps)
