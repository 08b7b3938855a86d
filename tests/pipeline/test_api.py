"""The scripted-reuse API writes a chain's exported files exactly where the user asked (issue 26.6)."""

from __future__ import annotations

from pathlib import Path

import onnxruntime
import torch
from torch import nn

from paretorch.pipeline.api import StageContext, run_chain
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import ExportResult
from paretorch.pipeline.engine.deliver import companions, deliver
from paretorch.stages.export.onnx import ONNXExportConfig
from paretorch.stages.prune.stage import PruneConfig

CPU = torch.device("cpu")


def test_run_chain_writes_its_exports_into_output_dir_itself(digits_spec: ModelSpec, digits_model: nn.Module,
                                                           tmp_path: Path) -> None:
    output = tmp_path / "exports" / "int8"
    chain = run_chain(digits_model, [PruneConfig(ratio=0.3), ONNXExportConfig(quantize="none", measure_latency=False)],
                      StageContext(digits_spec, CPU, output_dir=output))
    [result] = chain.exports
    assert result.path == output / "digits.onnx"
    assert sorted(p.name for p in output.iterdir()) == ["digits.onnx"], "no exports/<hash>/ folder, no staging left"
    session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    (images,) = digits_spec.example_inputs(4)
    (scores,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    with torch.no_grad():
        assert torch.allclose(torch.from_numpy(scores), chain.model(images), atol=1e-4)


def test_deliver_copies_a_file_with_its_external_data_and_replaces_an_older_copy(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "0123abcd"
    cache.mkdir(parents=True)
    (cache / "model.onnx").write_bytes(b"graph")
    (cache / "model.onnx.data").write_bytes(b"weights")
    (cache / "manifest.json").write_text("{}")
    folder = tmp_path / "trial-003"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"old graph")
    delivered = deliver(ExportResult("onnx", cache / "model.onnx", 5, "checked"), folder)
    assert delivered.path == folder / "model.onnx" and delivered.validation == "checked"
    assert (folder / "model.onnx").read_bytes() == b"graph" and (folder / "model.onnx.data").read_bytes() == b"weights"
    assert not (folder / "manifest.json").exists()
    assert companions(folder / "model.onnx") == [folder / "model.onnx", folder / "model.onnx.data"]


def test_deliver_copies_a_package_directory(tmp_path: Path) -> None:
    package = tmp_path / "cache" / "key" / "digits.openvino"
    package.mkdir(parents=True)
    (package / "digits.xml").write_text("<net/>")
    (package / "digits.bin").write_bytes(b"\0")
    delivered = deliver(ExportResult("openvino", package, 7, "ok"), tmp_path / "out")
    assert sorted(p.name for p in delivered.path.iterdir()) == ["digits.bin", "digits.xml"]
