"""The amp stage's policies compile to one graph and cast only where the dtype changes:
every layer reduced is exactly ``model.to(dtype)`` (bit-identical outputs, no layer cast),
a partial policy casts a layer's inputs only where they arrive in another dtype; on the
digits CNN and on MiniLM (issue 24)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from paretorch.pipeline.core.spec import ACCURACY, Batch, ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply
from paretorch.stages.amp.casting import cast_floating
from paretorch.stages.amp.stage import AmpConfig
from paretorch.stages.amp.switch import PrecisionSwitch
from paretorch.stages.amp.units import find_precision_units

CPU = torch.device("cpu")
MINILM_LAYER = "encoder.encoder.layer"
#: A partial MiniLM policy: the embeddings and the last block's output projection kept float32.
MINILM_FP32 = ("encoder.embeddings", f"{MINILM_LAYER}.5.output")


@pytest.fixture(scope="module")
def minilm(results_dir: Path) -> Iterator[tuple[ModelSpec, nn.Module]]:
    from paretorch.experiments.models.minilm import spec
    from paretorch.pipeline.core.spec import load_model

    minilm_spec = spec()
    yield minilm_spec, load_model(minilm_spec)


def _apply(spec: ModelSpec, source: nn.Module, config: AmpConfig) -> tuple[nn.Module, StageContext]:
    ctx = StageContext(spec=spec, device=CPU)
    return apply(source, config, ctx), ctx


def _graph_breaks(model: nn.Module, inputs: Batch) -> tuple[int, int]:
    """(graphs, graph breaks) of ``model`` under torch.compile (dynamo's explain)."""
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(*inputs)
    return explained.graph_count, explained.graph_break_count


def _cast_layers(model: nn.Module) -> list[str]:
    """The modules that carry a forward pre-hook (the amp stage's layer input casts)."""
    return [name for name, module in model.named_modules() if module._forward_pre_hooks]


def _floating_dtypes(model: nn.Module) -> set[torch.dtype]:
    return {t.dtype for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()}


def _whole_model_cast(source: nn.Module, inputs: Batch, dtype: torch.dtype) -> Tensor:
    """The reference: ``model.to(dtype)`` on inputs of ``dtype``, output back to float32."""
    with torch.no_grad():
        return copy.deepcopy(source).to(dtype)(*cast_floating(inputs, dtype)).float()


# --------------------------------------------------------------------------- digits


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_digits_full_policy_is_exactly_a_whole_model_cast(
    digits_spec: ModelSpec, digits_model: nn.Module, dtype: str
) -> None:
    model, ctx = _apply(digits_spec, digits_model, AmpConfig(dtype=dtype, fp32_layers=()))  # type: ignore[arg-type]
    reduced = getattr(torch, dtype)
    assert ctx.resolved_config == AmpConfig(dtype=dtype, fp32_layers=())  # type: ignore[arg-type]
    assert _floating_dtypes(model) == {reduced}
    assert _cast_layers(model) == [] and not any(m._forward_hooks for m in model.modules())
    inputs = digits_spec.example_inputs(5)
    with torch.no_grad():
        out = model(*inputs)
    assert out.dtype == torch.float32
    assert torch.equal(out, _whole_model_cast(digits_model, inputs, reduced))


@pytest.mark.parametrize("fp32_layers", [(), ("classifier.3",), ("features.0", "features.1")])
def test_digits_policies_compile_to_one_graph(
    digits_spec: ModelSpec, digits_model: nn.Module, fp32_layers: tuple[str, ...]
) -> None:
    model, _ = _apply(digits_spec, digits_model, AmpConfig(dtype="bfloat16", fp32_layers=fp32_layers))
    assert _graph_breaks(model, digits_spec.example_inputs(4)) == (1, 0)


def test_digits_calibrated_partial_policy_compiles_to_one_graph(
    digits_spec: ModelSpec, digits_model: nn.Module
) -> None:
    model, ctx = _apply(digits_spec, digits_model, AmpConfig(dtype="bfloat16", error_budget=1e-3))
    resolved = ctx.resolved_config
    assert isinstance(resolved, AmpConfig) and resolved.fp32_layers  # calibration kept layers in float32
    assert _graph_breaks(model, digits_spec.example_inputs(4)) == (1, 0)


def test_digits_partial_policy_casts_only_where_the_dtype_changes(
    digits_spec: ModelSpec, digits_model: nn.Module
) -> None:
    model, _ = _apply(digits_spec, digits_model, AmpConfig(dtype="bfloat16", fp32_layers=("classifier.3",)))
    # float32 images into the reduced first conv; reduced activations into the float32 head: nothing between
    assert _cast_layers(model) == ["features.0", "classifier.3"]
    inputs = digits_spec.example_inputs(3)
    with torch.no_grad():
        out = model(*inputs)
    assert out.dtype == torch.float32
    head = dict(model.named_modules())["classifier.3"]
    assert {p.dtype for p in head.parameters()} == {torch.float32}
    assert _floating_dtypes(dict(model.named_modules())["features"]) == {torch.bfloat16}


def test_dropping_the_unneeded_casts_keeps_the_outputs(digits_spec: ModelSpec, digits_model: nn.Module) -> None:
    model = copy.deepcopy(digits_model).eval()
    units = find_precision_units(model)
    switch = PrecisionSwitch(model, units, torch.bfloat16)
    switch.set_reduced(name for name in units.candidates if not name.startswith("classifier"))
    assert switch.cast_units() == units.names and not switch.full  # every unit casts before the probe
    inputs = digits_spec.example_inputs(6)
    with torch.no_grad():
        before = model(*inputs)
        switch.keep_needed_casts(lambda: model(*digits_spec.example_inputs(2)))
        after = model(*inputs)
    assert switch.cast_units() == ("features.0", "classifier.1")
    assert torch.equal(before, after)
    switch.set_reduced(units.candidates)  # every layer: the whole-model cast, no layer cast left
    assert switch.full and switch.cast_units() == ()
    with torch.no_grad():
        assert torch.equal(model(*inputs), _whole_model_cast(digits_model, inputs, torch.bfloat16))
    switch.set_reduced(())  # back to float32: the original tensors, every unit casting again
    assert switch.cast_units() == units.names and _floating_dtypes(model) == {torch.float32}
    with torch.no_grad():
        assert torch.equal(model(*inputs), digits_model(*inputs))


def test_full_policy_deepcopy_is_independent(digits_spec: ModelSpec, digits_model: nn.Module) -> None:
    model, _ = _apply(digits_spec, digits_model, AmpConfig(dtype="bfloat16", fp32_layers=()))
    inputs = digits_spec.example_inputs(2)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        expected = model(*inputs)
        for parameter in clone.parameters():
            parameter.zero_()
        assert torch.equal(model(*inputs), expected)  # the copy's forward runs the copy, not the original
        assert not torch.equal(clone(*inputs), expected)
        assert clone(*inputs).dtype == torch.float32


class RootOwned(nn.Module):
    """A root-level parameter, a floating buffer in a module without parameters, an integer input."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.offset = nn.Parameter(torch.randn(8))
        self.window = _Window()
        self.head = nn.Linear(8, 2)

    def forward(self, ids: Tensor, scale: Tensor) -> Tensor:
        return self.head(self.window(self.embed(ids) + self.offset).mean(dim=1) * scale)


class _Window(nn.Module):
    weights: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weights", torch.linspace(0.5, 1.5, 8))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weights


def test_full_policy_also_casts_tensors_outside_the_layers() -> None:
    torch.manual_seed(0)
    source = RootOwned().eval()
    ids, scale = torch.randint(0, 20, (4, 5)), torch.rand(4, 1)
    spec = ModelSpec(
        name="root-owned",
        build=lambda: source,
        example_inputs=lambda b: (ids[:b], scale[:b]),
        calibration=lambda: [(ids, scale)],
        evaluation=lambda: [((ids, scale), torch.zeros(4, dtype=torch.long))],
        metric=ACCURACY,
    )
    full, _ = _apply(spec, source, AmpConfig(dtype="bfloat16", fp32_layers=()))
    assert _floating_dtypes(full) == {torch.bfloat16}
    with torch.no_grad():
        assert torch.equal(full(ids, scale), _whole_model_cast(source, (ids, scale), torch.bfloat16))
    partial, _ = _apply(spec, source, AmpConfig(dtype="bfloat16", fp32_layers=("head",)))
    layers = dict(partial.named_modules())
    assert partial.offset.dtype == layers["window"].weights.dtype == torch.float32  # outside the layers: kept
    assert layers["embed"].weight.dtype == torch.bfloat16
    assert _graph_breaks(partial, (ids, scale)) == (1, 0)


# --------------------------------------------------------------------------- MiniLM


def test_minilm_full_policy_is_one_graph_and_exactly_a_whole_model_cast(minilm: tuple[ModelSpec, nn.Module]) -> None:
    spec, source = minilm
    model, _ = _apply(spec, source, AmpConfig(dtype="bfloat16", fp32_layers=()))
    assert _floating_dtypes(model) == {torch.bfloat16}
    assert _cast_layers(model) == []
    inputs = spec.example_inputs(4)
    with torch.no_grad():
        out = model(*inputs)
    assert out.dtype == torch.float32
    assert torch.equal(out, _whole_model_cast(source, inputs, torch.bfloat16))
    assert _graph_breaks(model, inputs) == (1, 0)


def test_minilm_partial_policy_is_one_graph_casting_only_at_dtype_changes(
    minilm: tuple[ModelSpec, nn.Module],
) -> None:
    spec, source = minilm
    model, ctx = _apply(spec, source, AmpConfig(dtype="bfloat16", fp32_layers=MINILM_FP32))
    resolved = ctx.resolved_config
    assert isinstance(resolved, AmpConfig) and resolved.fp32_layers is not None
    assert {f"{MINILM_LAYER}.5.output.dense", "encoder.embeddings.word_embeddings"} <= set(resolved.fp32_layers)
    # float32 embeddings into the first block's q / k / v, and (through the float32 residual) into its first
    # LayerNorm; reduced activations into the last block's float32 output projection. Nothing else casts.
    first = f"{MINILM_LAYER}.0.attention"
    assert _cast_layers(model) == [
        f"{first}.self.query",
        f"{first}.self.key",
        f"{first}.self.value",
        f"{first}.output.LayerNorm",
        f"{MINILM_LAYER}.5.output.dense",
    ]
    inputs = spec.example_inputs(4)
    with torch.no_grad():
        assert model(*inputs).dtype == torch.float32
    assert _graph_breaks(model, inputs) == (1, 0)
