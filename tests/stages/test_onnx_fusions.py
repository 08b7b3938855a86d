"""ORT's fused transformer ops on a dynamo export of a small BERT sentence encoder (MiniLM's form)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import pytest
import torch

from paretorch.pipeline.core.ort_session import open_session
from paretorch.pipeline.sources.huggingface import PooledEmbedding
from paretorch.stages.export.onnx import ONNXExportConfig
from paretorch.stages.export.onnx_export import _export_float_graph
from paretorch.stages.export.onnx_fusions import ORT_DOMAIN, transformer_fusions
from paretorch.stages.export.onnx_residual_order import residual_before_bias
from tests.ort_graphs import session_ops

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")
LAYERS = 2


def _tiny_sentence_encoder() -> torch.nn.Module:
    """A 2-layer BERT with MiniLM's head: mean pooling and L2 normalization (whose ReduceL2 breaks
    onnxruntime's symbolic shape inference, which ORT's own offline BERT optimizer needs)."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    return PooledEmbedding(transformers.BertModel(config), pooling="mean", normalize=True).eval()


def test_dynamo_bert_export_gets_attention_fused_and_no_skip_layer_norm(tmp_path: Path) -> None:
    model = _tiny_sentence_encoder()
    ids = torch.randint(1, 100, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # padded sequences: the attention mask must survive the fusion
    mask[2, 3:] = 0
    ids = ids * mask
    path = tmp_path / "float.onnx"
    _export_float_graph(model, (ids, mask), ONNXExportConfig(), path)

    graph, note = transformer_fusions(path)

    fused = Counter(node.op_type for node in graph.graph.node if node.domain == ORT_DOMAIN)
    assert fused["MultiHeadAttention"] == LAYERS, note
    assert fused["SkipLayerNormalization"] == 0, note  # slow on ORT's CPU provider (onnx_residual_order)
    assert fused["BiasGelu"] == LAYERS, note
    assert f"{LAYERS} MultiHeadAttention" in note
    assert not any(node.op_type == "Softmax" for node in graph.graph.node)  # no unfused attention left
    # the Q/K/V projections stay MatMuls on constant weights, for the int8 step to quantize
    initializers = {init.name for init in graph.graph.initializer}
    assert sum(node.op_type == "MatMul" and node.input[1] in initializers for node in graph.graph.node) == 6 * LAYERS
    assert any(entry.domain == ORT_DOMAIN for entry in graph.opset_import)

    assert residual_before_bias(graph) == 2 * LAYERS  # attention output and FFN output of each layer
    ops, _ = session_ops(graph, tmp_path)  # what a plain session makes of the file
    assert ops["SkipLayerNormalization"] == 0, ops
    fused_path = tmp_path / "fused.onnx"
    onnx.save(graph, str(fused_path))
    other_ids = torch.randint(1, 100, (5, 9))  # another batch size and length: the shapes stay dynamic
    other_mask = torch.ones_like(other_ids)
    other_mask[0, 4:] = 0
    for inputs in ((ids, mask), (other_ids * other_mask, other_mask)):
        with torch.no_grad():
            expected = model(*inputs)
        got = open_session(fused_path, CPU)(*inputs)
        assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
