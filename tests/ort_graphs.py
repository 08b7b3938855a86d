"""The graph onnxruntime actually runs: what a plain session (``ORT_ENABLE_ALL``, the default) makes of a model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import onnxruntime


def session_ops(model: onnx.ModelProto, tmp_path: Path) -> tuple[Counter[str], onnxruntime.InferenceSession]:
    """The op types of the graph a plain CPU session runs for ``model`` (its optimized copy written under
    ``tmp_path``), and that session."""
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    return Counter(node.op_type for node in optimized.graph.node), session
