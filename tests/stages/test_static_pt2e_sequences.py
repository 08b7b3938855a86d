"""Token models (batches padded to their own longest sample) through PT2E static int8 and the ONNX export."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from paretorch.stages.quantize import static_pt2e
from paretorch.stages.quantize.static_pt2e import quantize_static_pt2e


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.proj(self.embed(ids))) * mask.unsqueeze(-1)
        return hidden.sum(dim=1) / mask.sum(dim=1, keepdim=True).clamp_min(1)


def _batch(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, 50, (rows, length), generator=generator), torch.ones(rows, length, dtype=torch.int64)


def test_sequence_length_stays_dynamic() -> None:
    torch.manual_seed(0)
    model = TokenModel().eval()
    quantized = quantize_static_pt2e(model, _batch(4, 12, 0), [_batch(8, 12, 1), _batch(8, 9, 2)], skip_layers=())
    for length in (6, 12, 30):  # shorter and longer than the export's example
        ids, mask = _batch(3, length, 3)
        with torch.no_grad():
            out = quantized(ids, mask)
            reference = model(ids, mask)
        assert out.shape == (3, 16)
        assert torch.nn.functional.cosine_similarity(out, reference).min() > 0.95


def test_onnx_export_keeps_the_sequence_axis_dynamic(tmp_path: object) -> None:
    import onnxruntime

    from paretorch.stages.export.onnx import ONNXExportConfig
    from paretorch.stages.export.onnx_export import _export_float_graph

    torch.manual_seed(0)
    model = TokenModel().eval()
    path = tmp_path / "tokens.onnx"  # type: ignore[operator]
    _export_float_graph(model, _batch(4, 12, 0), ONNXExportConfig(), path)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for length in (6, 30):
        ids, mask = _batch(3, length, 3)
        (out,) = session.run(None, dict(zip(names, (ids.numpy(), mask.numpy()), strict=True)))
        with torch.no_grad():
            assert torch.allclose(torch.from_numpy(out), model(ids, mask), atol=1e-5)


class SamePaddedConv(nn.Conv2d):
    """A convolution subclass with its own ``forward`` (as efficientnet_lite_pytorch's ``Conv2dStaticSamePadding``):
    torch.export records no ``source_fn_stack`` for its ``F.conv2d``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.pad(x, (1, 1, 1, 1)), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


def test_convolutions_called_from_a_subclass_forward_are_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    """The x86 quantizer finds convolutions by their source; a subclass's own ``F.conv2d`` call has none until
    :func:`static_pt2e.tag_weighted_calls` gives it one (EfficientNet-Lite0: no layer was int8, 50 with the tags)."""
    model = nn.Sequential(SamePaddedConv(3, 8, 3), nn.ReLU6(), SamePaddedConv(8, 8, 3)).eval()
    batches = [(torch.randn(4, 3, 12, 12),) for _ in range(3)]
    converted = static_pt2e.quantize_static_pt2e(model, batches[0], batches, [])
    assert static_pt2e.quantized_layer_names(converted) == ["0", "2"]
    monkeypatch.setattr(static_pt2e, "tag_weighted_calls", lambda exported: 0)
    untagged = static_pt2e.quantize_static_pt2e(model, batches[0], batches, [])
    assert static_pt2e.quantized_layer_names(untagged) == [], "without the tags the quantizer sees none"
