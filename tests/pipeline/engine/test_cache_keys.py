"""A cache key covers the libraries of the chain it keys and no other: torch and the project's own always, the
libraries each stage of the chain (and the runtime an evaluation runs) declares, the distribution that provides
them; an upgrade of any of those never serves what the old version made, and an unrelated plugin changes no key."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import transformers
from torch import Tensor, nn

from paretorch.pipeline.core.runtimes.base import ExportHandle, Runtime
from paretorch.pipeline.core.runtimes.registry import get_runtime, registered_runtime
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, get_stage, registered
from paretorch.pipeline.engine import cache
from paretorch.pipeline.engine.graph import Node, Pipeline
from paretorch.pipeline.engine.runner import Runner

CPU = torch.device("cpu")


class ShiftConfig(StageConfig):
    stage = "toy.shift"
    amount: float = 0.5


def shift(model: nn.Module, config: ShiftConfig, ctx: StageContext) -> nn.Module:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(config.amount)
    return model


class HalveConfig(StageConfig):
    stage = "toy.halve"


def halve(model: nn.Module, config: HalveConfig, ctx: StageContext) -> nn.Module:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(0.5)
    return model


class Unrelated(Runtime):
    """A runtime plugin the chain below never runs, with a toolkit of its own."""

    name = "toy.unrelated"
    libraries = ("unrelated-toolkit",)

    def available(self, device: torch.device) -> bool:
        return True

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        return model


@pytest.fixture(scope="module", autouse=True)
def toy_stages() -> Iterator[None]:
    with registered(Stage(ShiftConfig, shift, libraries=("shift-lib",)), Stage(HalveConfig, halve)):
        yield


@pytest.fixture()
def versions(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The version table the keys read, injected: a name set here reads as installed at that version."""
    table: dict[str, str] = {}
    real = cache.installed_version
    monkeypatch.setattr(cache, "installed_version", lambda name: table.get(name, real(name)))
    return table


def chain_keys(spec: ModelSpec, tmp_path: Path) -> dict[str, str]:
    """The key of each node of ``model -> shift -> halve``, as a fresh runner computes them."""
    pipeline = Pipeline([Node("model", "model"), Node("shift", "toy.shift", ("model",)),
                         Node("halve", "toy.halve", ("shift",))], name="keys")
    runner = Runner(pipeline, spec, CPU, cache=cache.NodeCache(export_dir=tmp_path / "exports"),
                    work_dir=tmp_path / "work")
    result = runner.run({"shift": ShiftConfig(), "halve": HalveConfig()}, exports=False, evaluate=False)
    return {name: node.key for name, node in result.nodes.items()}


def test_an_unrelated_plugin_changes_no_key(residual_spec: ModelSpec, versions: dict[str, str],
                                            tmp_path: Path) -> None:
    before = chain_keys(residual_spec, tmp_path)
    # Another runtime installed, and every toolkit no node of this chain runs upgraded (MLX's plugin among them).
    versions.update(dict.fromkeys(("unrelated-toolkit", "paretorch-mlx", "mlx", "onnxruntime", "openvino", "nncf",
                                   "coremltools", "torchao", "torch-pruning", "transformers"), "999.0"))
    with registered_runtime(Unrelated()):
        assert chain_keys(residual_spec, tmp_path) == before


def test_a_key_changes_with_a_library_its_chain_declares(residual_spec: ModelSpec, versions: dict[str, str],
                                                         tmp_path: Path) -> None:
    before = chain_keys(residual_spec, tmp_path)
    versions["shift-lib"] = "2.0"
    after = chain_keys(residual_spec, tmp_path)
    assert after["model"] == before["model"], "the source does not run the stage"
    assert after["shift"] != before["shift"], "the stage that declares the library"
    assert after["halve"] != before["halve"], "what is made from its output (its input's key)"
    versions["torch"] = "99.0"
    assert set(chain_keys(residual_spec, tmp_path).values()).isdisjoint(after.values()), "torch keys every node"


def test_an_evaluation_is_keyed_on_its_runtime_and_the_export_it_reads() -> None:
    ort = set(cache.runtime_libraries(get_runtime("onnxruntime")))
    assert {"onnxruntime", "onnx", "onnxscript", "paretorch"} <= ort, "its own, its export stage's, its provider's"
    assert set(cache.runtime_libraries(get_runtime("eager"))).isdisjoint({"onnxruntime", "onnx", "mlx", "openvino"})


def test_a_stage_is_keyed_on_what_it_declares_and_who_provides_it() -> None:
    assert set(cache.stage_libraries(get_stage("quantize"))) == {"torchao", "paretorch"}
    assert set(cache.stage_libraries(get_stage("export.openvino"))) == {"openvino", "nncf", "paretorch"}


class Wrapper(nn.Module):
    """A model class of this checkout's ``tests`` package (a name an installed wheel also ships a folder under)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner


def test_the_source_is_keyed_on_the_code_of_its_modules() -> None:
    assert cache.model_libraries(Wrapper(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))) == ("torch",)
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=8))
    assert cache.model_libraries(bert) == ("torch", "transformers"), "a Hugging Face model's forward is its code"


def test_every_node_reads_torch_and_the_project() -> None:
    assert set(cache.library_versions()) == set(cache.ALWAYS_KEYED) == {"torch", "paretorch"}
    assert cache.installed_version("no-such-distribution-here") == "none"
