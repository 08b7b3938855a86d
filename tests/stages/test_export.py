"""The export stages: Core ML, ONNX and ExportedProgram artifacts of the digits CNN.

Float exports and int8-mirrored exports are made once per module (fixtures) and
checked by several tests: reload, numerics against torch, sizes, metadata,
validation text, the input models left untouched. Failing conversions and
failing validations must leave no partial file behind.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from paretorch.pipeline.core.device import capabilities
from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig
from paretorch.pipeline.core.evaluate import compute_metric
from paretorch.pipeline.core.mirror import NotMirrored
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import (
    ExportResult,
    Stage,
    StageConfig,
    StageContext,
    apply,
    config_from_dict,
    get_stage,
    registered,
)
from paretorch.stages.export import coreml_export, onnx_export
from paretorch.stages.export.atomic import STAGING_SUFFIX, atomic_artifact
from paretorch.stages.export.coreml import CoreMLExportConfig
from paretorch.stages.export.metadata import RECIPE_KEY, VERSIONS_KEY
from paretorch.stages.export.onnx import ONNXExportConfig
from paretorch.stages.export.pt2 import PT2ExportConfig
from paretorch.stages.quantize.stage import QuantizeConfig

CPU = torch.device("cpu")
#: The int8 artifacts must be at most this fraction of the float ones. Measured on this CPU
#: (digits, head kept float as the quantize stage does): Core ML 767,733 -> 368,943 bytes,
#: ONNX 769,351 -> 375,841 bytes.
INT8_SIZE_RATIO = 0.6


@dataclass
class Exports:
    ctx: StageContext
    output_dir: Path
    coreml: ExportResult
    onnx: ExportResult
    pt2: ExportResult
    model: nn.Module


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same_state(before: dict[str, torch.Tensor], model: nn.Module) -> bool:
    after = model.state_dict()
    return before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def _accuracy(model: Any, spec: ModelSpec) -> float:
    return compute_metric(model, spec.evaluation(), spec.metric, CPU)


@pytest.fixture(scope="module")
def float_state(digits_model: nn.Module) -> dict[str, torch.Tensor]:
    return _state(digits_model)


@pytest.fixture(scope="module")
def float_exports(tmp_path_factory: pytest.TempPathFactory, digits_spec: ModelSpec, digits_model: nn.Module) -> Exports:
    output_dir = tmp_path_factory.mktemp("float_exports")
    ctx = StageContext(spec=digits_spec, device=CPU, output_dir=output_dir)
    return Exports(
        ctx=ctx,
        output_dir=output_dir,
        coreml=apply(digits_model, CoreMLExportConfig(), ctx),
        onnx=apply(digits_model, ONNXExportConfig(), ctx),
        pt2=apply(digits_model, PT2ExportConfig(), ctx),
        model=digits_model,
    )


@pytest.fixture(scope="module")
def quantized_model(digits_spec: ModelSpec, digits_model: nn.Module) -> nn.Module:
    """The digits CNN after the real quantize stage (torchao int8 weight-only)."""
    return apply(digits_model, QuantizeConfig(method="int8_weight_only"), StageContext(spec=digits_spec, device=CPU))


@pytest.fixture(scope="module")
def int8_exports(
    tmp_path_factory: pytest.TempPathFactory,
    digits_spec: ModelSpec,
    digits_model: nn.Module,
    quantized_model: nn.Module,
) -> Exports:
    """Exports of the torchao-quantized model, the float graph handed over as ctx.float_model."""
    output_dir = tmp_path_factory.mktemp("int8_exports")
    ctx = StageContext(
        spec=digits_spec,
        device=CPU,
        output_dir=output_dir,
        upstream=(QuantizeConfig(method="int8_weight_only"),),
        float_model=digits_model,
    )
    return Exports(
        ctx=ctx,
        output_dir=output_dir,
        coreml=apply(quantized_model, CoreMLExportConfig(), ctx),
        onnx=apply(quantized_model, ONNXExportConfig(measure_latency=False), ctx),
        pt2=apply(quantized_model, PT2ExportConfig(), ctx),
        model=quantized_model,
    )


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize(
    "config",
    [
        CoreMLExportConfig(),
        CoreMLExportConfig(
            compute_units="CPU_AND_NE", minimum_deployment_target="iOS18", palettize_bits=6, batch_size=4
        ),
        ONNXExportConfig(),
        ONNXExportConfig(opset=23, dynamic_batch=False, batch_size=8, quantize="int8_dynamic", measure_latency=False),
        PT2ExportConfig(dynamic_batch=False),
    ],
)
def test_json_round_trip(config: StageConfig) -> None:
    data = json.loads(json.dumps(config.to_dict()))
    assert config_from_dict(data) == config
    assert get_stage(config.stage).produces == "export"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"stage": "export.coreml", "compute_units": "GPU"}, r"compute_units='GPU'"),
        ({"stage": "export.coreml", "minimum_deployment_target": "macOS12"}, r"minimum_deployment_target='macOS12'"),
        ({"stage": "export.coreml", "palettize_bits": 3}, r"palettize_bits=3"),
        ({"stage": "export.coreml", "batch_size": 0}, r"batch_size=0: Input should be greater than or equal to 1"),
        ({"stage": "export.onnx", "opset": 16}, r"opset=16: Input should be greater than or equal to 17"),
        ({"stage": "export.onnx", "opset": 24}, r"opset=24: Input should be less than or equal to 23"),
        ({"stage": "export.onnx", "quantize": "int4"}, r"quantize='int4'"),
        ({"stage": "export.pt2", "strict": True}, r"strict=True: Extra inputs are not permitted"),
    ],
)
def test_invalid_values_name_field_and_value(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


@pytest.mark.parametrize("config_type", [CoreMLExportConfig, ONNXExportConfig, PT2ExportConfig])
def test_suggest_returns_the_default(config_type: type[StageConfig], digits_spec: ModelSpec) -> None:
    import optuna

    trial: Any = optuna.trial.FixedTrial({})
    assert config_type.suggest(trial, StageContext(spec=digits_spec, device=CPU)) == config_type()


# --------------------------------------------------------------------------- float exports


def test_coreml_package_reloads_with_recipe_and_versions(float_exports: Exports) -> None:
    import coremltools as ct

    result = float_exports.coreml
    assert result.path == float_exports.output_dir / "digits.mlpackage"
    assert result.format == "coreml" and result.path.is_dir() and result.size_bytes > 100_000
    reloaded = ct.models.MLModel(str(result.path), skip_model_load=True)
    description = reloaded.get_spec().description
    assert [(f.name, list(f.type.multiArrayType.shape)) for f in description.input] == [("x", [1, 1, 8, 8])]
    assert [list(f.type.multiArrayType.shape) for f in description.output] == [[1, 10]]
    assert json.loads(reloaded.user_defined_metadata[RECIPE_KEY]) == []
    assert "coremltools" in json.loads(reloaded.user_defined_metadata[VERSIONS_KEY])
    assert "compute float32 (no AMP in the recipe)" in result.validation


def test_coreml_validation_says_whether_it_predicted(float_exports: Exports) -> None:
    validation = float_exports.coreml.validation
    assert "reloaded; inputs and outputs checked" in validation
    if capabilities(CPU).coreml_predict:
        assert "predicted on ALL" in validation
    else:
        assert "not predicted: Core ML predictions need macOS" in validation


def test_onnx_matches_torch_and_reports_metrics(float_exports: Exports, digits_spec: ModelSpec) -> None:
    import onnx
    import onnxruntime

    result = float_exports.onnx
    assert result.path == float_exports.output_dir / "digits.onnx"
    assert not result.path.with_name("digits.onnx.data").exists()
    session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    inputs = digits_spec.example_inputs(5)  # dynamic batch: not the export's batch of 2
    (output,) = session.run(None, {session.get_inputs()[0].name: inputs[0].numpy()})
    with torch.no_grad():
        expected = float_exports.model(*inputs)
    assert torch.allclose(torch.from_numpy(output), expected, rtol=0, atol=1e-4)
    metrics = result.metrics
    assert metrics["onnx_max_abs_error"] <= 1e-4
    assert metrics["onnx_accuracy"] == pytest.approx(_accuracy(float_exports.model, digits_spec), abs=1e-6)
    assert metrics["onnx_latency_ms_p50_b1"] > 0 and metrics["onnx_latency_ms_p50_b32"] > 0
    props = {p.key: p.value for p in onnx.load(str(result.path)).metadata_props}
    assert json.loads(props[RECIPE_KEY]) == []
    assert "onnxruntime (CPU) matches torch" in result.validation


def test_pt2_reloads_and_matches(float_exports: Exports, digits_spec: ModelSpec) -> None:
    result = float_exports.pt2
    assert result.path == float_exports.output_dir / "digits.pt2" and result.size_bytes > 0
    inputs = digits_spec.example_inputs(7)
    with torch.no_grad():
        assert torch.allclose(torch.export.load(result.path).module()(*inputs), float_exports.model(*inputs))
    assert "reloaded with torch.export.load" in result.validation


def test_output_dir_holds_only_the_artifacts(float_exports: Exports) -> None:
    names = sorted(p.name for p in float_exports.output_dir.iterdir())
    assert names == ["digits.mlpackage", "digits.onnx", "digits.pt2"]


# --------------------------------------------------------------------------- int8 mirror


def test_int8_mirror_shrinks_coreml_and_onnx(float_exports: Exports, int8_exports: Exports) -> None:
    assert int8_exports.coreml.size_bytes < INT8_SIZE_RATIO * float_exports.coreml.size_bytes
    assert int8_exports.onnx.size_bytes < INT8_SIZE_RATIO * float_exports.onnx.size_bytes
    assert "int8_weight_only mirrored: int8 per-channel linear_symmetric" in int8_exports.coreml.validation
    assert "1 constexpr_affine_dequantize" in int8_exports.coreml.validation
    assert "int8_weight_only mirrored: onnxruntime dynamic int8" in int8_exports.onnx.validation
    # Lossy but close: the ONNX int8 model keeps the float accuracy within a point.
    assert int8_exports.onnx.metrics["onnx_accuracy"] >= float_exports.onnx.metrics["onnx_accuracy"] - 0.01
    assert not any(key.startswith("onnx_latency") for key in int8_exports.onnx.metrics)


def test_coreml_metadata_holds_the_recipe(int8_exports: Exports) -> None:
    import coremltools as ct

    reloaded = ct.models.MLModel(str(int8_exports.coreml.path), skip_model_load=True)
    recipe = json.loads(reloaded.user_defined_metadata[RECIPE_KEY])
    assert recipe == [QuantizeConfig(method="int8_weight_only").to_dict()]
    assert config_from_dict(recipe[0]) == QuantizeConfig(method="int8_weight_only")


def test_pt2_exports_the_quantized_model_itself(int8_exports: Exports, digits_spec: ModelSpec) -> None:
    inputs = digits_spec.example_inputs(3)
    with torch.no_grad():
        reloaded = torch.export.load(int8_exports.pt2.path).module()(*inputs)
        assert torch.equal(reloaded, int8_exports.model(*inputs))
    extra = {f"{RECIPE_KEY}.json": ""}
    torch.export.load(int8_exports.pt2.path, extra_files=extra)
    assert json.loads(extra[f"{RECIPE_KEY}.json"]) == [QuantizeConfig(method="int8_weight_only").to_dict()]


def test_input_models_untouched(
    float_exports: Exports,
    int8_exports: Exports,
    float_state: dict[str, torch.Tensor],
    digits_model: nn.Module,
    quantized_model: nn.Module,
    digits_spec: ModelSpec,
) -> None:
    assert _same_state(float_state, digits_model)
    assert not digits_model.training
    assert type(dict(quantized_model.named_modules())["classifier.1"].weight).__name__ == "Int8Tensor"
    inputs = digits_spec.example_inputs(4)
    with torch.no_grad():
        assert torch.equal(quantized_model(*inputs), torch.export.load(int8_exports.pt2.path).module()(*inputs))


def test_coreml_mirrors_amp_sparsity_and_int8_jointly(
    tmp_path: Path, float_exports: Exports, digits_spec: ModelSpec, digits_model: nn.Module
) -> None:
    """AMP -> float16 with the fp32 layer kept; pruned zeros stored sparse and int8 on top (iOS18 joint)."""
    from paretorch.stages.amp.stage import AmpConfig
    from paretorch.stages.prune.stage import PruneConfig

    pruned = copy.deepcopy(digits_model)
    with torch.no_grad():
        for module in pruned.modules():
            if isinstance(module, nn.Linear | nn.Conv2d):
                weight = module.weight
                weight[weight.abs() <= weight.abs().flatten().kthvalue(int(0.6 * weight.numel())).values] = 0
    upstream = (
        PruneConfig(method="unstructured", ratio=0.6),
        QuantizeConfig(method="int8_weight_only"),
        AmpConfig(dtype="float16", fp32_layers=("classifier.1",)),
    )
    ctx = StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path, upstream=upstream, float_model=pruned)
    result = apply(digits_model, CoreMLExportConfig(minimum_deployment_target="iOS18"), ctx)
    assert "compute float16; kept in float32: classifier.1" in result.validation
    assert "zeros of the unstructured pruning stored sparse" in result.validation
    assert "1 constexpr_sparse_blockwise_shift_scale" in result.validation  # sparse + int8 in one weight
    assert result.size_bytes < 0.3 * float_exports.coreml.size_bytes


# --------------------------------------------------------------------------- failures


def test_torchao_graph_without_float_model_is_infeasible_and_writes_nothing(
    tmp_path: Path, digits_spec: ModelSpec, digits_model: nn.Module
) -> None:
    """Without ctx.float_model the torchao graph itself is converted; coremltools has no
    converter for torchao's dynamic int8 ops, so the export is infeasible and writes nothing."""
    ctx = StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path)
    dynamic_int8 = apply(digits_model, QuantizeConfig(method="int8_dynamic"), ctx)
    with pytest.raises(
        InfeasibleConfig,
        match=r"Core ML conversion failed: torch\.export: .*choose_qparams_affine.*; torch\.jit\.trace: ",
    ):
        apply(dynamic_int8, CoreMLExportConfig(), ctx)
    assert list(tmp_path.iterdir()) == []


def test_failed_coreml_validation_leaves_no_partial_package(
    tmp_path: Path, digits_spec: ModelSpec, digits_model: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[Path] = []

    def reject(ct: Any, path: Path, *args: Any) -> list[str]:
        written.append(path)
        assert path.is_dir()  # the package was fully saved in the staging directory
        raise InfeasibleConfig("simulated validation failure")

    monkeypatch.setattr(coreml_export, "_check_package", reject)
    with pytest.raises(InfeasibleConfig, match="simulated validation failure"):
        apply(digits_model, CoreMLExportConfig(), StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path))
    assert written and not written[0].exists()
    assert list(tmp_path.iterdir()) == []


def test_failed_onnx_export_keeps_the_previous_file(
    tmp_path: Path,
    float_exports: Exports,
    digits_spec: ModelSpec,
    digits_model: nn.Module,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    previous = tmp_path / "digits.onnx"
    previous.write_bytes(float_exports.onnx.path.read_bytes())

    def broken_session(path: Path) -> Any:
        assert path.stat().st_size > 100_000  # written completely, then rejected
        raise InfeasibleConfig("simulated onnxruntime failure")

    monkeypatch.setattr(onnx_export, "_session", broken_session)
    ctx = StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path)
    with pytest.raises(InfeasibleConfig, match="simulated onnxruntime failure"):
        apply(digits_model, ONNXExportConfig(quantize="int8_dynamic", measure_latency=False), ctx)
    assert [p.name for p in tmp_path.iterdir()] == ["digits.onnx"]
    assert previous.read_bytes() == float_exports.onnx.path.read_bytes()


class _DataDependentBranch(nn.Module):
    """torch.export cannot trace a Python branch on a tensor value."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        return y if float(y.detach().sum()) > 0 else -y


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:Output.*has been renamed:UserWarning")
def test_coreml_falls_back_to_tracing(tmp_path: Path, digits_spec: ModelSpec, digits_model: nn.Module) -> None:
    import coremltools as ct

    ctx = StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path)
    result = apply(_DataDependentBranch(copy.deepcopy(digits_model)), CoreMLExportConfig(batch_size=3), ctx)
    assert result.validation.startswith("converted from torch.jit.trace (failed before: torch.export: ")
    description = ct.models.MLModel(str(result.path), skip_model_load=True).get_spec().description
    assert [(f.name, list(f.type.multiArrayType.shape)) for f in description.input] == [("x", [3, 1, 8, 8])]


def test_pt2_export_failure_is_infeasible(tmp_path: Path, digits_spec: ModelSpec, digits_model: nn.Module) -> None:
    ctx = StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path)
    with pytest.raises(InfeasibleConfig, match=r"torch\.export of the model failed: \w+"):
        apply(_DataDependentBranch(copy.deepcopy(digits_model)), PT2ExportConfig(), ctx)
    assert list(tmp_path.iterdir()) == []


def test_atomic_artifact_replaces_a_directory_only_when_complete(tmp_path: Path) -> None:
    (tmp_path / "model.mlpackage").mkdir()
    (tmp_path / "model.mlpackage" / "old.bin").write_text("old")
    with pytest.raises(RuntimeError, match="half-written"), atomic_artifact(tmp_path, "model.mlpackage") as staged:
        staged.mkdir()
        (staged / "new.bin").write_text("new")
        raise RuntimeError("half-written")
    assert [p.name for p in (tmp_path / "model.mlpackage").iterdir()] == ["old.bin"]
    with atomic_artifact(tmp_path, "model.mlpackage") as staged:
        staged.mkdir()
        (staged / "new.bin").write_text("new")
    assert [p.name for p in (tmp_path / "model.mlpackage").iterdir()] == ["new.bin"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(STAGING_SUFFIX)]


def test_onnx_fixed_batch_runs_the_evaluation_in_chunks(
    tmp_path: Path, float_exports: Exports, digits_spec: ModelSpec, digits_model: nn.Module
) -> None:
    import onnxruntime

    ctx = StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path)
    result = apply(digits_model, ONNXExportConfig(dynamic_batch=False, batch_size=16), ctx)
    session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == [16, 1, 8, 8]
    # 397 evaluation samples in chunks of 16 (the last one padded) give the float accuracy.
    assert result.metrics["onnx_accuracy"] == float_exports.onnx.metrics["onnx_accuracy"]
    assert [k for k in result.metrics if k.startswith("onnx_latency")] == ["onnx_latency_ms_p50_b16"]
    assert "fixed batch 16" in result.validation


class _ShiftConfig(StageConfig):
    """A numeric stage that no exporter can reproduce (declared NotMirrored)."""

    stage = "toy.shift"


def test_a_not_mirrored_stage_is_recorded_by_the_export(
    digits_spec: ModelSpec, digits_model: nn.Module, tmp_path: Path
) -> None:
    shift = Stage(_ShiftConfig, lambda model, config, ctx: model, numeric=True,
                  mirror=NotMirrored("its offsets have no ONNX counterpart"))
    with registered(shift):
        ctx = StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path, upstream=(_ShiftConfig(),),
                           float_model=copy.deepcopy(digits_model))
        result = apply(digits_model, ONNXExportConfig(measure_latency=False), ctx)
    assert "not mirrored: toy.shift: its offsets have no ONNX counterpart" in result.validation


def test_the_onnxruntime_runtimes_export_leaves_evaluation_to_its_trial(
    tmp_path: Path, digits_spec: ModelSpec, digits_model: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file a runtime runs is evaluated and timed by that runtime's trial: its export makes no pass of its own
    over the evaluation split (a second full pass per ONNX Runtime or OpenVINO trial), a plain export still does."""
    from paretorch.pipeline.core.runtimes.onnxruntime import ONNXRUNTIME
    from paretorch.stages.export import checks

    assert ONNXRUNTIME.export is not None
    config = ONNXExportConfig(**ONNXRUNTIME.export.settings)
    passes: list[int] = []
    real = checks.compute_metric
    monkeypatch.setattr(checks, "compute_metric", lambda *a, **k: passes.append(1) or real(*a, **k))
    result = apply(digits_model, config, StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path / "runtime"))
    assert passes == [] and not [k for k in result.metrics if k == "onnx_accuracy" or "latency" in k]
    assert result.metrics["onnx_max_abs_error"] <= 1e-4  # the file is still checked against torch
    plain = apply(digits_model, ONNXExportConfig(), StageContext(spec=digits_spec, device=CPU, output_dir=tmp_path))
    assert passes == [1] and "onnx_accuracy" in plain.metrics
