"""ONNX Runtime static int8 (QDQ) as the mirror of PT2E static int8: a layer's input and weight are
quantized, its output stays float (onnxruntime's QDQ would otherwise also round each MatMul output to
per-tensor uint8, which cost MiniLM cosine 0.912 against torch).

The recipe is judged on every CPU by the QDQ graph run node by node (no fusion: float math on the
quantized values, what exact int8 arithmetic gives); onnxruntime's fused int8 kernels match that on every
CPU: where u8 x s8 products would saturate (x86 without VNNI), the stage takes 7-bit weights
(:func:`int8_products_saturate`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from paretorch.pipeline.core.device import int8_products_saturate
from paretorch.stages.export.layer_filter import LayerFilter
from paretorch.stages.export.onnx_int8 import Int8Plan, count_int8_ops, quantize_int8


def test_only_x86_without_vnni_or_amx_saturates() -> None:
    assert int8_products_saturate(frozenset({"avx2", "fma"}), "x86_64")
    assert not int8_products_saturate(frozenset({"avx2", "avx512f", "avx512_vnni"}), "x86_64")
    assert not int8_products_saturate(frozenset({"avx2", "avx_vnni"}), "x86_64")
    assert not int8_products_saturate(frozenset({"amx_int8", "amx_tile"}), "x86_64")
    assert not int8_products_saturate(frozenset(), "arm64")


def _cosine(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.dot(got.ravel(), want.ravel()) / (np.linalg.norm(got) * np.linalg.norm(want)))


def _two_layer_graph() -> object:
    """x -> MatMul(w1) + b1 -> Relu -> MatMul(w2) + b2 -> + x (a residual block, 16 wide)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
             for name, shape in (("w1", (16, 32)), ("b1", (32,)), ("w2", (32, 16)), ("b2", (16,)))]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["a1"], name="add1"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="fc2"),
        helper.make_node("Add", ["h2", "b2"], ["a2"], name="add2"),
        helper.make_node("Add", ["a2", "x"], ["y"], name="residual"),
    ]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_static_qdq_quantizes_layer_inputs_and_weights_not_outputs(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import onnxruntime

    graph = _two_layer_graph()
    plan = Int8Plan(layer_filter=LayerFilter(kinds=("linear",), min_weight_elements=0, skip_head=False,
                                             protected=()), mode="static")
    generator = torch.Generator().manual_seed(1)
    calibration = [(torch.randn(32, 16, generator=generator),) for _ in range(4)]
    quantized = quantize_int8(graph, plan, ["fc1", "fc2"], tmp_path / "block.onnx", calibration)  # type: ignore[arg-type]

    assert count_int8_ops(quantized) > 0
    assert capsys.readouterr().out == "", "onnxruntime's calibration chatter stays off the console"
    producers = {out: node for node in quantized.graph.node for out in node.output}
    quantize_inputs = [node.input[0] for node in quantized.graph.node if node.op_type == "QuantizeLinear"]
    assert "x" in quantize_inputs and "r1" in quantize_inputs  # both layers' activations are quantized
    assert not [name for name in quantize_inputs if name in producers and producers[name].op_type == "MatMul"]
    for node in quantized.graph.node:
        if node.op_type == "MatMul":
            assert all(producers[i].op_type == "DequantizeLinear" for i in node.input)

    x = torch.randn(64, 16, generator=generator).numpy()
    cpu = ["CPUExecutionProvider"]
    node_by_node = onnxruntime.SessionOptions()
    node_by_node.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    (fused,) = onnxruntime.InferenceSession(str(tmp_path / "block.onnx"), providers=cpu).run(None, {"x": x})
    (exact,) = onnxruntime.InferenceSession(str(tmp_path / "block.onnx"), node_by_node, providers=cpu).run(
        None, {"x": x})
    (want,) = onnxruntime.InferenceSession(graph.SerializeToString(), providers=cpu).run(None, {"x": x})
    assert _cosine(exact, want) > 0.999  # the recipe, on any CPU
    assert _cosine(fused, exact) > 0.99999, (f"onnxruntime's fused int8 kernels on this CPU "
                                             f"(saturating: {int8_products_saturate()})")


@pytest.mark.parametrize("saturates", [False, True])
def test_weights_take_7_bits_where_int8_products_saturate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          saturates: bool) -> None:
    from onnx import numpy_helper

    monkeypatch.setattr("paretorch.stages.export.onnx_int8.int8_products_saturate", lambda: saturates)
    plan = Int8Plan(layer_filter=LayerFilter(kinds=("linear",), min_weight_elements=0, skip_head=False,
                                             protected=()), mode="dynamic")
    quantized = quantize_int8(_two_layer_graph(), plan, ["fc1", "fc2"], tmp_path / "block.onnx", [])  # type: ignore[arg-type]
    weights = [numpy_helper.to_array(t) for t in quantized.graph.initializer if t.data_type == 3]  # int8
    assert weights
    largest = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert largest <= 64 if saturates else largest == 127
