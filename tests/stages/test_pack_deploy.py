"""The pack stage's deployable path: no host read inside the call, packed == padded (bf16 too) for ragged
batches, the callable rebuilt from a saved recipe, and the search's and gpu_rows' inputs giving one packed graph.

Small BERT models with random weights (``tests/stages/test_pack.py``'s); nothing is downloaded.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from paretorch.pipeline.api import StageContext, run_chain
from paretorch.pipeline.core.padding import latency_inputs, latency_sample, trim_to_longest
from paretorch.pipeline.core.runtimes.base import RuntimeExport
from paretorch.pipeline.core.runtimes.eager import Eager
from paretorch.pipeline.core.runtimes.registry import registered_runtime
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.stages.pack.deploy import PackedEncoder, deploy_runtimes
from paretorch.stages.pack.layout import host_starts, pack_padded, pack_token_lists
from paretorch.stages.pack.packed import PackedBert
from paretorch.stages.pack.stage import PackConfig
from tests.stages.test_pack import (
    CPU,
    FP32_TOLERANCE,
    batch,
    max_diff,
    one_thread,  # noqa: F401  (the autouse fixture: one torch thread)
    packed_of,
    tiny_classifier,
    tiny_pooled,
    tiny_spec,
)

#: What reads a tensor's values back to the host (on an accelerator: a device-to-host copy and a sync).
HOST_READS: tuple[Callable[..., Any], ...] = (
    Tensor.item, Tensor.tolist, Tensor.cpu, Tensor.numpy, Tensor.nonzero, torch.nonzero, Tensor.__int__,
    Tensor.__float__, Tensor.__bool__, Tensor.__index__, torch.Tensor.__len__,
)


class HostReadError(AssertionError):
    pass


class NoHostReads(TorchFunctionMode):
    """Raises on any call that reads tensor values back to the host (the CPU's stand-in for
    ``torch.cuda.set_sync_debug_mode("error")``)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in HOST_READS:
            raise HostReadError(f"host read inside the packed call: {getattr(func, '__name__', func)}")
        return func(*args, **(kwargs or {}))


def token_lists(ids: Tensor, mask: Tensor) -> list[list[int]]:
    return [row[: int(keep.sum())].tolist() for row, keep in zip(ids, mask, strict=True)]


RAGGED = {"ragged": [16, 12, 1, 9, 3, 16, 5, 7], "one-token": [1], "one-row": [11], "all-full": [16, 16, 16, 16]}


def test_the_guard_catches_a_host_read() -> None:
    _, mask = batch([5, 3])
    with NoHostReads(), pytest.raises(HostReadError, match=r"tolist|item"):
        host_starts(mask, bucket=True)  # the padded batch's path reads its lengths: the guard sees it


@pytest.mark.parametrize("runtime", ["eager", "compile"])
@pytest.mark.parametrize("lengths", list(RAGGED.values()), ids=list(RAGGED))
def test_the_deployable_call_reads_nothing_back_and_equals_padded(lengths: list[int], runtime: str) -> None:
    model = tiny_pooled()
    encoder = PackedEncoder(packed_of(copy.deepcopy(model)), CPU, runtime)
    ids, mask = batch(lengths)
    lists = token_lists(ids, mask)
    with torch.inference_mode():
        expected = model(ids, mask)
    encoder(lists)  # a compiled runtime compiles here (dynamo reads shapes while tracing)
    with NoHostReads():
        from_lists = encoder(lists)  # host packing of python lists, one copy, the graph with its layout
    assert max_diff(from_lists, expected) < FP32_TOLERANCE
    assert max_diff(encoder.padded(ids, mask), expected) < FP32_TOLERANCE


def test_a_one_row_padded_batch_reads_nothing_back() -> None:
    model = tiny_classifier()
    packed = packed_of(copy.deepcopy(model))
    ids, mask = batch([5])
    with torch.inference_mode(), NoHostReads():
        actual = packed(ids, mask)
    with torch.inference_mode():
        assert max_diff(actual, model(ids, mask)) < FP32_TOLERANCE


@pytest.mark.parametrize("lengths", list(RAGGED.values()), ids=list(RAGGED))
def test_packed_bf16_equals_padded_bf16_within_bf16_tolerance(lengths: list[int]) -> None:
    model = tiny_pooled()
    reduced = copy.deepcopy(model).to(torch.bfloat16)
    encoder = PackedEncoder(packed_of(copy.deepcopy(reduced)), CPU)
    ids, mask = batch(lengths, seed=5)
    with torch.inference_mode():
        padded, reference = reduced(ids, mask).float(), model(ids, mask)
        through_forward = packed_of(copy.deepcopy(reduced))(ids, mask).float()
    scale = float(reference.abs().max())
    for actual in (encoder(token_lists(ids, mask)), through_forward):
        assert max_diff(actual, padded) < 5e-2 * scale
        assert 0 < max_diff(actual, reference) < 5e-2 * scale  # bf16 did run


def test_host_packing_of_lists_and_of_a_padded_batch_is_the_same_buffer() -> None:
    ids, mask = batch([5, 1, 3])
    from_lists, from_padded = pack_token_lists(token_lists(ids, mask), True), pack_padded(ids, mask, True)
    assert torch.equal(from_lists.buffer, from_padded.buffer)
    assert (from_lists.tokens, from_lists.width, from_lists.rows) == (16, 16, 3)
    assert from_lists.buffer[16:].tolist() == [0, 5, 6, 9, 16]
    assert from_lists.buffer[:5].tolist() == ids[0, :5].tolist() and from_lists.buffer[9:16].tolist() == [0] * 7


def test_bad_inputs_say_what_to_give() -> None:
    encoder = PackedEncoder(packed_of(tiny_pooled()), CPU)
    with pytest.raises(ValueError, match="1 to 32 ids"):
        encoder([[1, 2], []])
    with pytest.raises(ValueError, match="1 to 32 ids"):
        encoder([list(range(1, 34))])
    with pytest.raises(TypeError, match="PackedBert"):
        PackedEncoder(tiny_pooled(), CPU)
    with pytest.raises(ValueError, match="compile_dynamic"):
        PackedEncoder(packed_of(tiny_pooled()), CPU, "compile_dynamic")


def test_the_callable_round_trips_through_a_saved_recipe(tmp_path: Path) -> None:
    model = tiny_pooled()
    spec = tiny_spec(model)
    path = Recipe((PackConfig(),), runtime="compile", model=spec.name).save(tmp_path / "recipe.json")
    recipe = Recipe.load(path)  # what `pipeline apply --recipe` replays: the same chain through the runner
    rebuilt = run_chain(spec.build(), recipe.stages, StageContext(spec=spec, device=CPU)).model
    assert isinstance(rebuilt, PackedBert)
    encoder = PackedEncoder(rebuilt, CPU, recipe.runtime)
    ids, mask = batch([16, 2, 9, 13], seed=3)
    with torch.inference_mode():
        assert max_diff(encoder(token_lists(ids, mask)), model(ids, mask)) < FP32_TOLERANCE


@pytest.mark.parametrize("runtime", ["eager", "compile"])
def test_search_and_gpu_rows_inputs_give_one_packed_graph(runtime: str) -> None:
    """The search times a runtime on ``latency_inputs`` (a static-shape runtime: the width bucket), gpu_rows
    on the batch cut to its longest sample: the packed model runs the same token bucket and attention width on
    both, so both time the same graph."""
    model = tiny_pooled()
    spec = tiny_spec(model)
    packed = packed_of(copy.deepcopy(model))
    searched = latency_inputs(spec, 8, runtime)[0]
    benched = trim_to_longest(latency_sample(spec, 8), 1)
    bucket = runtime != "eager"
    assert host_starts(searched[1], bucket)[1:] == host_starts(benched[1], bucket)[1:]
    with torch.inference_mode():
        assert max_diff(packed(*searched), packed(*benched)) < FP32_TOLERANCE


def test_a_compiled_one_row_batch_runs_the_unpacked_graph() -> None:
    model = tiny_pooled()
    packed = packed_of(copy.deepcopy(model))
    ids, mask = batch([5])
    torch.compiler.reset()
    explanation = torch._dynamo.explain(packed)(ids, mask)
    targets = [str(node.target) for graph in explanation.graphs for node in graph.graph.nodes]
    assert explanation.graph_break_count == 0 and not any("cumsum" in target for target in targets)
    compiled = torch.compile(packed, dynamic=False)
    with torch.inference_mode():
        assert max_diff(compiled(ids, mask), model(ids, mask)) < FP32_TOLERANCE


class TorchPlugin(Eager):
    """A plugin runtime that runs the torch module itself (eager's behaviour under another name)."""

    name = "toy.torch_plugin"


class FilePlugin(Eager):
    """A plugin runtime that declares the file it runs."""

    name = "toy.file_plugin"
    export = RuntimeExport("export.onnx")


def test_the_runtimes_a_pack_recipe_deploys_under_are_declared_not_listed() -> None:
    assert set(deploy_runtimes()) >= {"eager", "compile"} and not {"onnxruntime", "openvino",
                                                                   "compile_dynamic"} & set(deploy_runtimes())
    with registered_runtime(TorchPlugin(), FilePlugin()):
        assert "toy.torch_plugin" in deploy_runtimes() and "toy.file_plugin" not in deploy_runtimes()
        model = tiny_pooled()
        encoder = PackedEncoder(packed_of(copy.deepcopy(model)), CPU, "toy.torch_plugin")
        ids, mask = batch([5, 2, 7])
        with torch.inference_mode():
            assert max_diff(encoder(token_lists(ids, mask)), model(ids, mask)) < FP32_TOLERANCE
        with pytest.raises(ValueError, match=r"toy\.file_plugin"):
            PackedEncoder(packed_of(tiny_pooled()), CPU, "toy.file_plugin")
