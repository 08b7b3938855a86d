"""OpenVINO's machine probe: the CPU plugin's float32 ``MatMul`` against the same product under the bfloat16
precision hint and in int8 (both inputs behind ``FakeQuantize``, the pattern NNCF writes and the plugin's
low-precision pass runs as int8), paired (:func:`paretorch.pipeline.core.machine_probe.paired_gain`). On an AVX2 CPU
without VNNI its int8 product ran 0.92x float32, which is why its static int8 preset ran slower than fp32 there.
A precision the plugin cannot compile here does not pay (an exact 0)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from paretorch.pipeline.core.machine_probe import SHAPE, Gain, paired_gain
from paretorch.pipeline.core.ov_core import shared_core

if TYPE_CHECKING:
    from openvino import Model, Node


def openvino_gains() -> dict[str, Gain]:
    """bfloat16's and int8's gains under OpenVINO's CPU plugin."""
    import openvino as ov
    import openvino.opset13 as ops

    m, k, n = SHAPE
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((k, n), dtype=np.float32)
    activations = np.abs(rng.standard_normal((m, k), dtype=np.float32))

    def quantized(node: Node, low: float, high: float, levels: int) -> Node:
        low_c, high_c = ops.constant(np.float32(low)), ops.constant(np.float32(high))
        return ops.fake_quantize(node, low_c, high_c, low_c, high_c, levels)

    def product(int8: bool) -> Model:
        a, w = ops.parameter([m, k], np.float32, name="a"), ops.constant(weights)
        x = quantized(a, 0.0, 4.0, 256) if int8 else a
        y = ops.matmul(x, quantized(w, -4.0, 4.0, 255) if int8 else w, False, False)
        return ov.Model([y], [a], "probe")

    core = shared_core()

    def compiled(model: Model, hint: str) -> Callable[[], object] | None:
        config = {"INFERENCE_NUM_THREADS": str(torch.get_num_threads()), "NUM_STREAMS": "1",
                  "INFERENCE_PRECISION_HINT": hint}
        try:
            request = core.compile_model(model, "CPU", config).create_infer_request()
        except RuntimeError:  # e.g. bf16 declared by the CPU's flags, but oneDNN capped below it
            return None
        return lambda: request.infer({0: activations})

    fp32 = compiled(product(False), "f32")
    if fp32 is None:
        raise RuntimeError("OpenVINO's CPU plugin could not compile a float32 MatMul: its runtime cannot run here")
    cpu = torch.device("cpu")
    gains = {}
    for precision, call in (("bf16", compiled(product(False), "bf16")), ("int8", compiled(product(True), "f32"))):
        gains[precision] = paired_gain(fp32, call, cpu) if call is not None else Gain.exact(0.0)
    return gains
