"""Accuracy-aware quantization (``fallback_budget``) and int8 PT2E on CNNs that share activations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.spec import ACCURACY, ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply, export_mirror
from paretorch.stages.common.rankings import SENSITIVITIES
from paretorch.stages.export.layer_filter import LayerFilter
from paretorch.stages.quantize.stage import QuantizeConfig

CPU = torch.device("cpu")
BUDGET = 0.05
FALLBACK_METHODS = ["int8_dynamic", "int8_weight_only", "int8_static_pt2e"]


class FragileMLP(nn.Module):
    """Two ordinary blocks, then ``fragile``: one enormous weight column whose input is always 0.

    In float the column changes nothing; quantized per output channel, the column sets every
    row's scale and the ordinary weights round to zero: the output is lost."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block1 = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
        self.block2 = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
        self.fragile = nn.Linear(64, 64)
        self.head = nn.Linear(64, 4)
        with torch.no_grad():
            self.block2[2].weight[0].zero_()  # feature 0 into `fragile` is always 0
            self.block2[2].bias[0] = 0.0
            self.fragile.weight[:, 0] = 1000.0

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.fragile(self.block2(self.block1(x)))))


def _spec(model: nn.Module, name: str, shape: tuple[int, ...]) -> ModelSpec:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(96, *shape, generator=generator)
    labels = torch.randint(0, 4, (96,), generator=generator)
    return ModelSpec(
        name=name,
        build=lambda: model,
        example_inputs=lambda batch: (inputs[:batch].clone(),),
        calibration=lambda: [(inputs[i : i + 16],) for i in range(0, 64, 16)],
        evaluation=lambda: [((inputs[64:],), labels[64:])],
        metric=ACCURACY,
    )


@pytest.fixture(scope="module")
def fragile() -> tuple[nn.Module, ModelSpec]:
    model = FragileMLP().eval()
    return model, _spec(model, "fragile_mlp", (64,))


def _error(model: nn.Module, quantized: nn.Module, spec: ModelSpec) -> float:
    (inputs,) = spec.calibration()[0]
    with torch.no_grad():
        ref, out = model(inputs), quantized(inputs)
    return float((out - ref).norm() / ref.norm())


@pytest.mark.parametrize("method", FALLBACK_METHODS)
def test_fragile_layer_stays_float_within_the_budget(method: str, fragile: tuple[nn.Module, ModelSpec]) -> None:
    model, spec = fragile
    plain = apply(model, QuantizeConfig(method=method), StageContext(spec=spec, device=CPU))
    assert _error(model, plain, spec) > 0.15  # without a budget the fragile layer is quantized: output lost

    ctx = StageContext(spec=spec, device=CPU)
    guarded = apply(model, QuantizeConfig(method=method, fallback_budget=BUDGET), ctx)
    assert "fragile" in ctx.records["quantize.float_layers"]
    assert ctx.records["quantize.float_layers"]["fragile"] > 0.15  # what it would have cost
    assert "fragile" not in ctx.records["quantize.layers"]
    assert ctx.records["quantize.layers"]  # the others are quantized
    assert ctx.records["quantize.output_error"] <= BUDGET
    assert _error(model, guarded, spec) <= BUDGET
    resolved = ctx.resolved_config
    assert isinstance(resolved, QuantizeConfig) and "fragile" in (resolved.float_layers or ())
    # The exports leave it float too.
    layer_filter = LayerFilter.from_upstream(export_mirror([resolved]), (), 0)
    assert layer_filter.skip_reason("fragile_weight", 4096, 64, False) == "kept float for accuracy (fragile)"
    assert layer_filter.skip_reason("block1_0_weight", 4096, 64, False) is None


def test_replay_keeps_the_listed_layers_float_without_calibrating(fragile: tuple[nn.Module, ModelSpec]) -> None:
    model, spec = fragile
    ctx = StageContext(spec=spec, device=CPU)
    apply(model, QuantizeConfig(method="int8_dynamic", float_layers=("fragile",), fallback_budget=BUDGET), ctx)
    assert "quantize.sensitivity" not in ctx.records
    assert ctx.records["quantize.skipped"]["fragile"] == "kept float (float_layers)"
    with pytest.raises(ConfigError, match=r"float_layers names no quantizable layer: nowhere"):
        apply(model, QuantizeConfig(method="int8_dynamic", float_layers=("nowhere",)), ctx)


def test_blocks_are_measured_before_their_layers(fragile: tuple[nn.Module, ModelSpec]) -> None:
    model, spec = fragile
    ctx = StageContext(spec=spec, device=CPU)
    apply(model, QuantizeConfig(method="int8_weight_only", fallback_budget=BUDGET), ctx)
    sensitivity = ctx.records["quantize.sensitivity"]
    # The two ordinary blocks were measured whole (one error shared by their layers).
    assert sensitivity["block1.0"] == sensitivity["block1.2"]
    assert sensitivity["fragile"] > 10 * sensitivity["block1.0"]


def test_sensitivities_persist_for_another_run(fragile: tuple[nn.Module, ModelSpec]) -> None:
    model, spec = fragile
    config = QuantizeConfig(method="int8_dynamic", fallback_budget=BUDGET)
    first = StageContext(spec=spec, device=CPU, input_key="fragile-persist")
    apply(model, config, first)
    SENSITIVITIES.memo.clear()  # what a new process starts with
    second = StageContext(spec=spec, device=CPU, input_key="fragile-persist")
    apply(model, QuantizeConfig(method="int8_dynamic", fallback_budget=2 * BUDGET), second)
    assert (first.records["quantize.calibration"], second.records["quantize.calibration"]) == ("measured", "reused")
    assert second.records["quantize.sensitivity"] == first.records["quantize.sensitivity"]


def test_another_process_reuses_the_persisted_sensitivities(tmp_path: Path) -> None:
    script = """
import sys, torch
from paretorch.pipeline.core.paths import set_results_dir
from paretorch.pipeline.core.stage import StageContext, apply
from paretorch.stages.quantize.stage import QuantizeConfig
sys.path.insert(0, "tests/stages")
from test_quantize_fallback import FragileMLP, _spec
set_results_dir(sys.argv[1])
model = FragileMLP().eval()
ctx = StageContext(spec=_spec(model, "fragile_mlp", (64,)), device=torch.device("cpu"), input_key="proc")
apply(model, QuantizeConfig(method="int8_weight_only", fallback_budget=0.05), ctx)
print(ctx.records["quantize.calibration"])
"""
    runs = [
        subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True,
                       cwd=Path(__file__).resolve().parents[2])
        for _ in range(2)
    ]
    assert [run.stdout.split()[-1] for run in runs] == ["measured", "reused"]


def test_time_budget_cuts_calibration_short_with_a_valid_model(fragile: tuple[nn.Module, ModelSpec]) -> None:
    model, spec = fragile
    ctx = StageContext(spec=spec, device=CPU)
    config = QuantizeConfig(method="int8_weight_only", fallback_budget=0.5, calibration_seconds=1e-6)
    quantized = apply(model, config, ctx)
    assert "time budget" in ctx.records["quantize.calibration_cut_short"]
    assert ctx.records["quantize.output_error"] <= 0.5
    assert quantized(*spec.example_inputs(4)).shape == (4, 4)


class SharedActivationCNN(nn.Module):
    """One ReLU and one SiLU module, each called after several convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.relu, self.silu = nn.ReLU(), nn.SiLU()
        self.convs = nn.ModuleList(nn.Conv2d(3 if i == 0 else 16, 16, 3, padding=1) for i in range(4))
        self.head = nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        for index, conv in enumerate(self.convs):
            x = (self.relu if index % 2 == 0 else self.silu)(conv(x))
        return self.head(x.mean(dim=(2, 3)))


def test_static_pt2e_quantizes_a_cnn_that_shares_activation_modules() -> None:
    model = SharedActivationCNN().eval()
    spec = _spec(model, "shared_act_cnn", (3, 12, 12))
    ctx = StageContext(spec=spec, device=CPU)
    quantized = apply(model, QuantizeConfig(method="int8_static_pt2e", min_weight_elements=0), ctx)
    assert sorted(ctx.records["quantize.layers"]) == [f"convs.{i}" for i in range(4)]
    assert _error(model, quantized, spec) < 0.1
