"""The OpenVINO runtime and its export: the one mirror table, the capability table, the IR against torch,
NNCF's int8 recorded as measured, a plain user's load, and a recipe OpenVINO cannot run ruled out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino
import pytest
import torch
from torch import nn

from paretorch.pipeline.core import device as device_module
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.evaluate import compute_metric
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.ov_session import default_precision, open_ir, recorded_settings
from paretorch.pipeline.core.runtimes.onnxruntime import ONNXRUNTIME
from paretorch.pipeline.core.runtimes.openvino import OPENVINO
from paretorch.pipeline.core.runtimes.registry import available_runtimes, get_runtime
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply_stage, export_mirror
from paretorch.pipeline.search import Search, SearchConfig, SeedRecipe, run_search
from paretorch.pipeline.search.objectives import ATTR_SEED
from paretorch.pipeline.search.rule_out import ATTR_RULED_OUT
from paretorch.stages.amp.stage import AmpConfig
from paretorch.stages.common.mirror_facts import WeightQuantization
from paretorch.stages.export.openvino import OpenVINOExportConfig
from paretorch.stages.export.openvino_nncf import calibration_samples, matmul_precision, weighted_ops
from paretorch.stages.pack.stage import PackConfig
from paretorch.stages.quantize.stage import QuantizeConfig

CPU = torch.device("cpu")

def test_each_exported_runtime_declares_what_it_reproduces_and_refuses_the_rest() -> None:
    def ort_unmirrored(mirror: ExportMirror) -> list[str]:
        return ONNXRUNTIME.reproduces.refusals(mirror)

    def ov_unmirrored(mirror: ExportMirror) -> list[str]:
        return OPENVINO.reproduces.refusals(mirror)

    dynamic, static, weights, int4 = (export_mirror([QuantizeConfig(method=method)]) for method in (
        "int8_dynamic", "int8_static_pt2e", "int8_weight_only", "intx_weight_only"))
    bf16 = export_mirror([AmpConfig(dtype="bfloat16")])
    assert ort_unmirrored(dynamic) == [] and ort_unmirrored(static) == []
    assert ort_unmirrored(weights) == ["quantize int8_weight_only (int8 weights, float activations): weight-only "
                                       "int8 keeps activations float, and ONNX Runtime's int8 kernels quantize them "
                                       "too (int8_dynamic is its mirror)"]
    assert ort_unmirrored(bf16) == ["AMP (bfloat16): ONNX Runtime runs the exported float32 graph: the recipe's "
                                    "reduced precision is not mirrored"]
    assert ov_unmirrored(static) == [] and ov_unmirrored(weights) == [] and ov_unmirrored(bf16) == []
    assert ov_unmirrored(dynamic)[0].startswith("quantize int8_dynamic (int8 weights, dynamic activations): "
                                                "activations quantized per row")
    assert ov_unmirrored(int4)[0].startswith("quantize intx_weight_only (int4 weights, float activations): only int8")
    assert ov_unmirrored(export_mirror([AmpConfig(dtype="float16")]))[0].startswith("AMP (float16): OpenVINO's CPU")
    kept = ov_unmirrored(export_mirror([AmpConfig(dtype="bfloat16", fp32_layers=("classifier",))]))
    assert kept == ["AMP keeps 1 layer(s) in float32: OpenVINO's inference precision applies to the whole model "
                    "(the IR's disable_fp16_compression marks did not keep ops in float32 under the CPU's bf16)"]
    assert ov_unmirrored(ExportMirror(not_mirrored=("prune: why",))) == ["prune: why: not declared (its stage "
                                                                         "values: pack)"]
    assert ov_unmirrored(export_mirror([PackConfig()])) == ort_unmirrored(export_mirror([PackConfig()])) == []
    # quantize="none": the export leaves the quantization's needs out, the AMP ones stay
    both = export_mirror([QuantizeConfig(method="int8_weight_only"), AmpConfig(dtype="bfloat16")])
    assert len(ort_unmirrored(both)) == 2
    assert ort_unmirrored(both.without(WeightQuantization)) == ort_unmirrored(bf16)


def test_the_capability_table_lists_only_the_devices_the_installed_openvino_has(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_module, "openvino_devices", lambda: ("CPU", "GPU.0", "NPU"))
    assert device_module.installed_ov_devices("cpu") == ("CPU",), "Intel GPU/NPU are no torch device"
    assert device_module.ov_device_note("GPU.0", ).startswith("unverified")
    monkeypatch.setattr(device_module, "openvino_devices", lambda: ())
    assert device_module.installed_ov_devices("cpu") == ()
    monkeypatch.setattr(device_module, "openvino_devices", lambda: ("GPU",))
    assert device_module.installed_ov_devices("cpu") == ()
    monkeypatch.setattr(device_module.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(device_module.platform, "machine", lambda: "arm64")
    assert device_module.ov_device_note("CPU") == device_module.OV_ARM_CPU_NOTE

def test_the_installed_openvino_runs_on_this_cpu() -> None:
    assert "CPU" in openvino.Core().available_devices
    assert "openvino" in available_runtimes(CPU)
    assert get_runtime("openvino").label(CPU) == "openvino (CPU)"

def _export(model: nn.Module, spec: ModelSpec, out: Path, upstream: tuple[QuantizeConfig, ...] = ()) -> tuple:
    ctx = StageContext(spec, CPU, output_dir=out, upstream=upstream, float_model=model)
    result = apply_stage(model, OpenVINOExportConfig(measure_latency=False), ctx)
    return result, ctx

def test_the_float_ir_matches_torch_and_a_plain_openvino_load_gives_the_measured_outputs(
        digits_spec: ModelSpec, digits_model: nn.Module, tmp_path: Path) -> None:
    result, ctx = _export(digits_model, digits_spec, tmp_path)
    xml = result.path / "digits.xml"
    assert xml.exists() and (result.path / "digits.bin").exists()
    assert ctx.resolved_config.inference_precision == "f32", "the precision is recorded, never a default"
    assert result.metrics["openvino_max_abs_error"] < 1e-4
    inputs = digits_spec.example_inputs(5)
    with torch.no_grad():
        expected = digits_model(*inputs)
    measured = open_ir(result.path, CPU)
    assert torch.allclose(measured(*inputs), expected, atol=1e-4)
    ran = measured.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    assert measured.settings.precision == ran == "f32", "reports state the precision the compiled model runs in"
    core = openvino.Core()
    recorded = recorded_settings(core.read_model(str(xml)))
    compiled = core.compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": recorded["inference_precision"]})
    plain = compiled([t.numpy() for t in inputs])[0]
    np.testing.assert_allclose(plain, measured(*inputs).numpy(), atol=1e-6)
    assert "paretorch" in recorded["versions"] and recorded["recipe"] == "[]"

def test_an_int8_ir_metric_is_the_one_openvino_measures(digits_spec: ModelSpec, digits_model: nn.Module,
                                                        tmp_path: Path) -> None:
    quantize = QuantizeConfig(method="int8_static_pt2e", min_weight_elements=0, skip_head=False)
    result, _ = _export(digits_model, digits_spec, tmp_path, (quantize,))
    assert "NNCF static int8" in result.validation and "FakeQuantize" in result.validation
    model = openvino.Core().read_model(str(result.path / "digits.xml"))
    assert any(op.get_type_name() == "FakeQuantize" for op in model.get_ops())
    reopened = open_ir(result.path, CPU)
    metric = compute_metric(reopened, digits_spec.evaluation(), digits_spec.metric, CPU)
    assert metric == pytest.approx(result.metrics[f"openvino_{digits_spec.metric.name}"])

def test_an_unmirrored_recipe_is_infeasible_for_the_runtime_export(digits_spec: ModelSpec, digits_model: nn.Module,
                                                                  tmp_path: Path) -> None:

    ctx = StageContext(digits_spec, CPU, output_dir=tmp_path, float_model=digits_model,
                       upstream=(QuantizeConfig(method="int8_dynamic"),))
    with pytest.raises(InfeasibleConfig,
                       match=r"OpenVINO cannot run this recipe as trained: quantize int8_dynamic \(int8 weights"):
        apply_stage(digits_model, OpenVINOExportConfig(unmirrored="infeasible"), ctx)

def test_a_recipe_openvino_cannot_run_is_ruled_out_and_not_counted(residual_spec: ModelSpec, tmp_path: Path) -> None:
    dynamic_on_ov = SeedRecipe(name="dyn-ov", runtime="openvino", stages=({"stage": "quantize",
                                                                          "method": "int8_dynamic"},))
    config = SearchConfig.load(None, sampler="random", runtimes=("eager", "openvino"), latency_budget="quick",
                               exports="none", compose=0, seeds=[dynamic_on_ov])
    search = Search(residual_spec, CPU, config, storage=f"sqlite:///{tmp_path / 'o.db'}", track=False)
    outcome = run_search(search, trials=2)
    seeded = {t.user_attrs[ATTR_SEED]: t for t in outcome.study.trials if ATTR_SEED in t.user_attrs}
    assert seeded["dyn-ov"].state.name == "PRUNED" and seeded["dyn-ov"].values is None
    assert seeded["dyn-ov"].user_attrs[ATTR_RULED_OUT].startswith(
        "runtime openvino cannot run this recipe as trained: quantize int8_dynamic (int8 weights, dynamic "
        "activations): activations quantized per row")


def test_a_trial_under_openvino_replays_to_the_same_ir_and_metric(digits_spec: ModelSpec, tmp_path: Path) -> None:
    """The runner makes the IR through export.openvino (the recipe names that export), the metric is
    OpenVINO's, and the recipe replayed from its JSON elsewhere rebuilds a byte-identical IR and metric."""
    from paretorch.pipeline.core.evaluate import LatencySettings
    from paretorch.pipeline.core.stage import config_from_dict
    from paretorch.pipeline.engine.cache import NodeCache
    from paretorch.pipeline.engine.graph import recipe_pipeline
    from paretorch.pipeline.engine.recipe import Recipe
    from paretorch.pipeline.engine.runner import Runner

    fast = LatencySettings(warmup_runs=1, min_runs=3, min_seconds=0)

    def runner(configs: tuple, folder: Path) -> Runner:  # type: ignore[type-arg]
        return Runner(recipe_pipeline(configs), digits_spec, CPU, cache=NodeCache(export_dir=folder / "exports"),
                      latency=fast, work_dir=folder)

    quantize = config_from_dict({"stage": "quantize", "method": "int8_static_pt2e"})
    result = runner((quantize,), tmp_path / "search").run(runtime="openvino")
    assert f"openvino CPU, {default_precision(CPU)} inference precision" in result.report.device, \
        "static int8 runs at OpenVINO's own precision for the CPU"
    recipe = Recipe.from_json(result.recipe(digits_spec.name).to_json())
    assert recipe.runtime == "openvino" and [c.stage for c in recipe.exports()] == ["export.openvino"]
    replay = runner(recipe.stages, tmp_path / "replay").run({}, recipe.runtime)
    assert replay.report.metric_value == result.report.metric_value
    first = next((tmp_path / "search" / "exports").glob("*/digits.openvino/digits.bin"))
    again = Path(replay.exports["export.openvino"].path) / "digits.bin"
    assert first.read_bytes() == again.read_bytes()


def tiny_bert_spec() -> tuple[ModelSpec, nn.Module]:
    """A 4-layer BERT (random weights, nothing downloaded) pooled to an embedding; 8 right-padded samples."""
    from transformers import BertConfig, BertModel

    from paretorch.pipeline.core.spec import ACCURACY
    from paretorch.pipeline.sources.huggingface import PooledEmbedding

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32)
    model = PooledEmbedding(BertModel(config), pooling="mean", normalize=True).eval()
    lengths = torch.tensor([16, 12, 9, 3, 16, 5, 7, 11])
    mask = (torch.arange(16)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, 100, (8, 16), generator=torch.Generator().manual_seed(0)) * mask
    inputs = (ids, mask)
    spec = ModelSpec(name="tiny_bert", build=lambda: model, example_inputs=lambda rows: tuple(t[:rows] for t in inputs),
                     calibration=lambda: [inputs], evaluation=lambda: [(inputs, torch.zeros(8, dtype=torch.long))],
                     metric=ACCURACY, latency_batch_sizes=(1,), padding_mask=1)
    return spec, model


def test_nncf_calibrates_on_each_sample_at_its_own_length() -> None:
    spec, _ = tiny_bert_spec()
    samples = calibration_samples(spec.calibration(), spec.padding_mask)
    assert [tuple(s[0].shape) for s in samples] == [(1, n) for n in (16, 12, 9, 3, 16, 5, 7, 11)]
    assert all(bool(s[1].all()) for s in samples), "no padding token is left in a calibration sample"
    assert [tuple(s[0].shape) for s in calibration_samples(spec.calibration(), None)] == [(1, 16)] * 8


def test_static_int8_quantizes_every_encoder_matmul_with_the_peers_nncf_settings(tmp_path: Path) -> None:
    """The IR sentence-transformers' OpenVINO + NNCF int8 makes (optimum-intel's OVQuantizationConfig): every
    linear layer int8 (activation FakeQuantize + int8 weight), transformer model type, preset MIXED, one NNCF
    sample per calibration sentence, overflow fix off, OpenVINO's own inference precision."""
    spec, model = tiny_bert_spec()
    result, ctx = _export(model, spec, tmp_path, (QuantizeConfig(method="int8_static_pt2e"),))
    ir = openvino.Core().read_model(str(result.path / "tiny_bert.xml"))
    matmuls = matmul_precision(ir)
    assert matmuls.int8 == 4 * 6, "Q, K, V, attention output, intermediate and output dense of each layer"
    assert matmuls.weight_only == ()
    assert not [op.name for op in weighted_ops(ir) if op.op_type == "MatMul"], "no MatMul keeps a float weight"

    def nncf(key: str) -> str:
        return str(ir.get_rt_info(["nncf", "quantization", key]).astype(str))

    assert (nncf("model_type"), nncf("preset"), nncf("subset_size")) == ("transformer", "mixed", "8")
    assert "'overflow_fix': 'disable'" in nncf("advanced_parameters")
    assert recorded_settings(ir)["inference_precision"] == default_precision(CPU)
    assert ctx.resolved_config.inference_precision == default_precision(CPU)
