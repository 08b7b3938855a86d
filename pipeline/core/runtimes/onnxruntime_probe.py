"""ONNX Runtime's machine probe: ``MatMul`` against ``MatMulInteger`` on its CPU provider, paired
(:func:`paretorch.pipeline.core.machine_probe.paired_gain`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from paretorch.pipeline.core.machine_probe import SHAPE, Gain, paired_gain

if TYPE_CHECKING:
    from onnx import NodeProto
    from onnxruntime import InferenceSession

#: The ONNX IR version of the probe graphs (the newest onnx writes one the pinned onnxruntime may not read).
IR_VERSION = 8


def onnxruntime_gains() -> dict[str, Gain]:
    """int8's gain: the same product as ``MatMulInteger`` (uint8 x int8) against float32 ``MatMul``."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    m, k, n = SHAPE

    def session(node: NodeProto, a_type: int, b_type: int, out_type: int) -> InferenceSession:
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
    return {"int8": paired_gain(lambda: float_session.run(None, floats), lambda: int_session.run(None, ints),
                                torch.device("cpu"))}
