"""The MLX runtime plugin (plugins/mlx): conversion parity on both built-in models, its quantization as the
quantize stage's options map to it, and what it refuses (CPU, as CI runs it; `make setup` installs mlx[cpu])."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("mlx.core", reason="the MLX plugin installs where an MLX wheel exists (make setup)")

from paretorch_mlx.lower import UnsupportedOps, lower, to_mx, to_torch
from paretorch_mlx.runtime import MLX

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import export_mirror
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.runner import Runner
from paretorch.stages.amp.stage import AmpConfig
from paretorch.stages.quantize.stage import QuantizeConfig

CPU = torch.device("cpu")


def _runner(spec: ModelSpec, model: nn.Module, tmp_path: Path, configs: list | None = None) -> Runner:
    return Runner(recipe_pipeline(configs or []), spec, CPU, cache=NodeCache(export_dir=tmp_path / "exports"),
                  work_dir=tmp_path, model=model)


def test_digits_logits_match_torch_within_1e_4(digits_spec: ModelSpec, digits_model: nn.Module,
                                               tmp_path: Path) -> None:
    fn = _runner(digits_spec, digits_model, tmp_path).prepare({}, "mlx")
    (inputs,) = digits_spec.example_inputs(32)
    with torch.no_grad():
        expected = digits_model.eval()(inputs)
    torch.testing.assert_close(fn(inputs), expected, atol=1e-4, rtol=0)
    assert "MLX" in fn.describe() and "float32" in fn.describe()  # type: ignore[attr-defined]


def test_minilm_embeddings_cosine_at_least_0_9999_in_float32(tmp_path: Path) -> None:
    from paretorch.experiments.models.minilm import spec

    minilm = spec()
    model = minilm.build().eval()
    fn = _runner(minilm, model, tmp_path).prepare({}, "mlx")
    for batch in (1, 8):
        inputs = minilm.example_inputs(batch)
        with torch.no_grad():
            expected = model(*inputs)
        got = fn(*inputs)
        cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
        assert got.shape == expected.shape and float(cosine.min()) >= 0.9999


def test_mlx_quantization_is_what_the_quantize_stage_maps_to(digits_spec: ModelSpec, digits_model: nn.Module,
                                                             tmp_path: Path) -> None:
    """int8 weight-only -> mx.quantize 8-bit in MLX's groups of 64 on the linear layers the stage's filter keeps
    (the digits head stays float: skip_head), and the model still classifies like torch's int8."""
    config = QuantizeConfig(method="int8_weight_only", min_weight_elements=0, skip_head=True)
    runner = _runner(digits_spec, digits_model, tmp_path, [config])
    fn = runner.prepare({}, "mlx")
    described = fn.describe()  # type: ignore[attr-defined]
    assert "1 linear weight(s) MLX-quantized (int8 g64), 1 float" in described
    (inputs,) = digits_spec.example_inputs(64)
    with torch.no_grad():
        expected = digits_model.eval()(inputs)
    got = fn(inputs)
    assert not torch.equal(got, expected), "quantized weights change the logits"
    assert float((got.argmax(-1) == expected.argmax(-1)).float().mean()) >= 0.95


def test_what_mlx_does_not_reproduce_is_refused_before_running() -> None:
    dynamic = MLX.cannot_run(export_mirror([QuantizeConfig(method="int8_dynamic")]), scripted=False)
    assert dynamic is not None and "MLX quantizes weights only" in dynamic
    bf16 = MLX.cannot_run(export_mirror([AmpConfig(dtype="bfloat16")]), scripted=False)
    assert bf16 is not None and "float32" in bf16
    assert MLX.cannot_run(export_mirror([QuantizeConfig(method="intx_weight_only")]), scripted=False) is None


def test_an_op_the_lowering_does_not_cover_is_named() -> None:
    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(4, 4, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rnn(x)[0]

    program = torch.export.export(Recurrent().eval(), (torch.randn(2, 3, 4),))
    with pytest.raises(UnsupportedOps, match=r"MLX lowering does not cover .*gru"):
        lower(program)


def test_an_apply_of_an_undeclared_recipe_is_infeasible(digits_spec: ModelSpec, digits_model: nn.Module,
                                                        tmp_path: Path) -> None:
    runner = _runner(digits_spec, digits_model, tmp_path, [QuantizeConfig(method="int8_dynamic")])
    with pytest.raises(InfeasibleConfig, match="MLX cannot run this recipe as trained"):
        runner.prepare({}, "mlx")


def test_arrays_round_trip_between_torch_and_mlx() -> None:
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert torch.equal(to_torch(to_mx(tensor), CPU), tensor)
