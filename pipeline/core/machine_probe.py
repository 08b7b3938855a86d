"""What pays on this machine: a few seconds of matrix products in float32, bfloat16 and int8 per engine.

A CPU without AVX512-BF16 or AMX runs torch's bfloat16 matmul through a slow path (749 ms against 16 ms for
float32, a 512 x 384 x 1536 product on one thread with ``ATEN_CPU_CAPABILITY=avx2``), and one without VNNI gets
little from int8 (15.7 ms against 16.2 ms). The search reads this once per study (:func:`probe_machine`, stored on
the study so a resumed one reads the same) and orders its presets by it: a reduced precision that does not pay
under an engine is not a preset trial there, and int8 comes first only where it pays
(:mod:`pipeline.search.presets`).

Engines: ``torch`` (eager and every ``torch.compile`` runtime: the same aten and oneDNN kernels),
``onnxruntime`` (``MatMul`` against ``MatMulInteger`` on its CPU provider) and ``openvino`` (its CPU plugin's
``MatMul`` in float32, under the bfloat16 precision hint, and behind ``FakeQuantize``: on an AVX2 CPU without
VNNI its int8 product runs 0.92x float32, which is why its static int8 preset ran slower than fp32 there).
Accelerators probe torch only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline.core.device import synchronize
from pipeline.core.ov_core import shared_core

#: The product timed: (m, k) @ (k, n), a transformer layer's projection at batch 32 x 16 tokens.
SHAPE = (512, 384, 1536)
#: Timed calls per precision (after one untimed call); the median counts.
CALLS = 5
#: A first call this many times slower than float32's median decides a precision without more calls.
SLOW = 10.0
#: A reduced precision pays when its product runs at least this much faster than float32.
PAYS = 1.15
#: Which engine's kernels a runtime runs (the ones not named run torch's).
#: The ONNX IR version of the probe graphs (the newest onnx writes one the pinned onnxruntime may not read).
IR_VERSION = 8
RUNTIME_ENGINES: Mapping[str, str] = {"onnxruntime": "onnxruntime", "openvino": "openvino"}


@dataclass(frozen=True)
class MachineProbe:
    """Per engine, each reduced precision's speed against float32 (``{"torch": {"bf16": 2.5, "int8": 4.5}}``);
    a missing entry was not measured (no kernel, another device)."""

    gains: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0

    def gain(self, runtime: str, precision: str) -> float | None:
        """``precision``'s measured speed against float32 under ``runtime``'s engine (None: not measured)."""
        if precision == "fp32":
            return 1.0
        return self.gains.get(engine_of(runtime), {}).get(precision)

    def pays(self, runtime: str, precision: str) -> bool | None:
        """Whether ``precision`` pays under ``runtime`` here (None: not measured, so not known)."""
        gain = self.gain(runtime, precision)
        return None if gain is None else gain >= PAYS

    def describe(self) -> str:
        """``machine probe (1.9 s): torch bf16 2.49x, int8 4.49x fp32; onnxruntime int8 3.10x``."""
        parts = [f"{engine} " + ", ".join(f"{p} {g:.2f}x" for p, g in gains.items())
                 for engine, gains in self.gains.items() if gains]
        return (f"machine probe ({self.seconds:.1f} s, matmul speed vs fp32): "
                + ("; ".join(parts) if parts else "nothing measured"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def engine_of(runtime: str) -> str:
    """The engine whose kernels ``runtime`` runs."""
    return RUNTIME_ENGINES.get(runtime, "torch")


def _median_ms(call: Callable[[], object], limit_ms: float = float("inf")) -> float:
    """The median of :data:`CALLS` timed calls after an untimed one; the first call alone when it took longer than
    ``limit_ms`` (a precision many times slower than float32 is decided by one call)."""
    start = time.perf_counter()
    call()
    first = 1000.0 * (time.perf_counter() - start)
    if first > limit_ms:
        return first
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        call()
        times.append(1000.0 * (time.perf_counter() - start))
    return statistics.median(times)


def _torch_gains(device: torch.device) -> dict[str, float]:
    m, k, n = SHAPE
    a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)

    def timed(x: torch.Tensor, y: torch.Tensor, op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
              limit_ms: float = float("inf")) -> float:
        def call() -> None:
            op(x, y)
            synchronize(device)
        return _median_ms(call, limit_ms)

    fp32 = timed(a, b, torch.mm)
    slow = SLOW * fp32 + 1.0  # a first call past this decides the precision alone
    gains = {"bf16": fp32 / timed(a.bfloat16(), b.bfloat16(), torch.mm, slow)}
    if device.type == "cuda":
        gains["fp16"] = fp32 / timed(a.half(), b.half(), torch.mm, slow)
    try:
        qa = torch.randint(-127, 127, (m, k), dtype=torch.int8, device=device)
        qb = torch.randint(-127, 127, (k, n), dtype=torch.int8, device=device)
        gains["int8"] = fp32 / timed(qa, qb, torch._int_mm, slow)
    except RuntimeError:  # no int8 matmul kernel on this device: int8 is left unmeasured, not guessed
        pass
    return gains


def _onnxruntime_gains() -> dict[str, float]:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    m, k, n = SHAPE

    def session(node: Any, a_type: int, b_type: int, out_type: int) -> Any:
        graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("a", a_type, [m, k]),
                                                    helper.make_tensor_value_info("b", b_type, [k, n])],
                                  [helper.make_tensor_value_info("y", out_type, [m, n])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        onnx.checker.check_model(model)
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    float_session = session(helper.make_node("MatMul", ["a", "b"], ["y"]), TensorProto.FLOAT, TensorProto.FLOAT,
                            TensorProto.FLOAT)
    int_session = session(helper.make_node("MatMulInteger", ["a", "b"], ["y"]), TensorProto.UINT8, TensorProto.INT8,
                          TensorProto.INT32)
    rng = np.random.default_rng(0)
    floats = {"a": rng.standard_normal((m, k), dtype=np.float32), "b": rng.standard_normal((k, n), dtype=np.float32)}
    ints = {"a": rng.integers(0, 255, (m, k), dtype=np.uint8), "b": rng.integers(-127, 127, (k, n), dtype=np.int8)}
    fp32 = _median_ms(lambda: float_session.run(None, floats))
    return {"int8": fp32 / _median_ms(lambda: int_session.run(None, ints))}


def _openvino_gains() -> dict[str, float]:
    """The CPU plugin's float32 ``MatMul`` against the same product in bfloat16 (the precision hint) and in int8
    (both inputs behind ``FakeQuantize``, the pattern NNCF writes and the plugin's low-precision pass runs as
    int8). A precision the plugin cannot compile here counts as not paying (0)."""
    import openvino as ov
    import openvino.opset13 as ops

    m, k, n = SHAPE
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((k, n), dtype=np.float32)
    activations = np.abs(rng.standard_normal((m, k), dtype=np.float32))

    def quantized(node: Any, low: float, high: float, levels: int) -> Any:
        low_c, high_c = ops.constant(np.float32(low)), ops.constant(np.float32(high))
        return ops.fake_quantize(node, low_c, high_c, low_c, high_c, levels)

    def product(int8: bool) -> Any:
        a, w = ops.parameter([m, k], np.float32, name="a"), ops.constant(weights)
        x = quantized(a, 0.0, 4.0, 256) if int8 else a
        y = ops.matmul(x, quantized(w, -4.0, 4.0, 255) if int8 else w, False, False)
        return ov.Model([y], [a], "probe")

    core = shared_core()

    def median_ms(model: Any, hint: str) -> float | None:
        config = {"INFERENCE_NUM_THREADS": str(torch.get_num_threads()), "NUM_STREAMS": "1",
                  "INFERENCE_PRECISION_HINT": hint}
        try:
            request = core.compile_model(model, "CPU", config).create_infer_request()
        except RuntimeError:  # e.g. bf16 declared by the CPU's flags, but oneDNN capped below it
            return None
        return _median_ms(lambda: request.infer({0: activations}))

    fp32 = median_ms(product(False), "f32")
    assert fp32 is not None, "OpenVINO's CPU plugin compiles a float32 MatMul on every CPU it runs on"
    bf16, int8 = median_ms(product(False), "bf16"), median_ms(product(True), "f32")
    return {"bf16": fp32 / bf16 if bf16 else 0.0, "int8": fp32 / int8 if int8 else 0.0}


def probe_machine(device: torch.device, engines: Mapping[str, Callable[[], dict[str, float]]] | None = None,
                  ) -> MachineProbe:
    """Time the products on ``device`` (the CPU's engines too when it is the CPU); ``engines``: replaces the
    measurements (tests inject throughputs)."""
    start = time.perf_counter()
    if engines is None:
        engines = {"torch": lambda: _torch_gains(device)}
        if device.type == "cpu":
            engines = {**engines, "onnxruntime": _onnxruntime_gains, "openvino": _openvino_gains}
    gains: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for engine, measure in engines.items():
            gains[engine] = {p: round(g, 3) for p, g in measure().items()}
    return MachineProbe(gains, time.perf_counter() - start)


def stage_precision(stages: tuple[Mapping[str, Any], ...]) -> str:
    """The lowest matmul precision a stage list (as dicts) asks for: ``int8``, ``bf16``, ``fp16``, ``fp32``, or
    ``other`` (a quantization the probe does not time, e.g. int4 weights)."""
    found = "fp32"
    for raw in stages:
        if raw.get("stage") == "quantize":
            return "int8" if str(raw.get("method", "")).startswith("int8") else "other"
        if raw.get("stage") == "amp":
            found = {"bfloat16": "bf16", "float16": "fp16"}.get(str(raw.get("dtype", "")), found)
    return found


def probe_reason(probe: MachineProbe, stages: tuple[Mapping[str, Any], ...], runtime: str) -> str | None:
    """Why a stage list (as dicts) is not worth a trial under ``runtime`` on this machine: it reduces the float
    precision (bf16, fp16) to one the probe found does not pay there. None otherwise (int8 that does not pay is
    tried later, not dropped: its layers are not all matmuls)."""
    precision = stage_precision(stages)
    if precision not in ("bf16", "fp16") or probe.pays(runtime, precision) is not False:
        return None
    gain = probe.gain(runtime, precision)
    return (f"the machine probe: {precision} matmul runs {gain:.2f}x float32 under {engine_of(runtime)} here "
            f"(it pays from {PAYS:.2f}x)")
