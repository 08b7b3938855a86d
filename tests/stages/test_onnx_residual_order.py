"""The residual add goes before the bias, so ONNX Runtime builds no slow SkipLayerNormalization."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from paretorch.stages.export.onnx_residual_order import residual_before_bias
from tests.ort_graphs import session_ops

HIDDEN = 16


def _block() -> onnx.ModelProto:
    """``LayerNormalization(Add(Add(MatMul(x, W), bias), residual))``, the residual computed after the bias add
    in node order (the rewrite must move the inner add to keep the graph sorted)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "bias"),
             numpy_helper.from_array(np.ones(HIDDEN, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]),
             helper.make_node("Add", ["y", "bias"], ["biased"]),
             helper.make_node("Relu", ["x"], ["residual"]),
             helper.make_node("Add", ["biased", "residual"], ["summed"]),
             helper.make_node("LayerNormalization", ["summed", "gamma", "beta"], ["out"], axis=-1)]
    shape = ["batch", "tokens", HIDDEN]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


def test_ort_fuses_the_usual_order_into_skip_layer_normalization(tmp_path: Path) -> None:
    """The fact the rewrite exists for: if onnxruntime stops fusing this, the rewrite can go."""
    ops, _ = session_ops(_block(), tmp_path)
    assert ops["SkipLayerNormalization"] == 1, ops


def test_reordered_block_keeps_its_outputs_and_gets_no_skip_layer_normalization(tmp_path: Path) -> None:
    original = _block()
    reordered = _block()

    assert residual_before_bias(reordered) == 1
    onnx.checker.check_model(reordered)  # still topologically sorted
    ops, session = session_ops(reordered, tmp_path)
    assert ops["SkipLayerNormalization"] == 0, ops
    assert ops["LayerNormalization"] == 1, ops
    x = np.random.default_rng(1).standard_normal((3, 5, HIDDEN)).astype(np.float32)
    _, plain = session_ops(original, tmp_path)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], plain.run(None, {"x": x})[0], atol=1e-5)


def test_an_add_read_elsewhere_or_without_a_bias_is_left_alone() -> None:
    exposed = _block()
    exposed.graph.output.append(helper.make_tensor_value_info("biased", TensorProto.FLOAT, None))
    assert residual_before_bias(exposed) == 0  # a graph output keeps its value

    shared = _block()
    shared.graph.node.append(helper.make_node("Relu", ["biased"], ["other"]))  # the inner add read twice
    assert residual_before_bias(shared) == 0

    no_bias = _block()
    no_bias.graph.node[1].input[1] = "y"  # Add(y, y): no 1-D initializer
    assert residual_before_bias(no_bias) == 0
