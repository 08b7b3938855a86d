"""The ``onnxruntime`` runtime: the trial's model exported (ONNX Runtime's int8 mirror of the quantize
stage included), run in an onnxruntime session, measured from its outputs; the file is the recipe's."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import onnx
import onnxruntime
import pytest
import torch
from torch import nn

from paretorch.pipeline.core import device as device_table
from paretorch.pipeline.core.device import ORT_PROVIDERS, Capabilities, capabilities, installed_ort_providers
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.evaluate import LatencySettings, compute_metric
from paretorch.pipeline.core.ort_session import SessionSettings
from paretorch.pipeline.core.runtimes import onnxruntime as runtime_module
from paretorch.pipeline.core.runtimes.registry import available_runtimes, get_runtime
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import config_from_dict
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.search.config import SearchConfig
from paretorch.pipeline.search.loop import run_search
from paretorch.pipeline.search.objectives import ATTR_REASON
from paretorch.pipeline.search.study import Search

CPU = torch.device("cpu")
FAST = LatencySettings(warmup_runs=1, min_runs=3, min_seconds=0)


def _runner(spec: ModelSpec, folder: Path, configs: list[dict[str, object]] = ()) -> Runner:  # type: ignore[assignment]
    pipeline = recipe_pipeline([config_from_dict(dict(c)) for c in configs])
    return Runner(pipeline, spec, CPU, cache=NodeCache(export_dir=folder / "exports"), latency=FAST,
                  work_dir=folder)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_capability_table_lists_only_the_installed_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = set(onnxruntime.get_available_providers())
    cpu = capabilities(CPU).ort_providers
    assert "CPUExecutionProvider" in cpu and set(cpu) <= installed
    assert all(ORT_PROVIDERS[p][0] == "cpu" for p in cpu)
    # another build: only the providers it has, each on its device; Azure is no device
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "AzureExecutionProvider",
                                 "CPUExecutionProvider"])
    assert installed_ort_providers("cuda") == ("TensorrtExecutionProvider", "CUDAExecutionProvider")
    assert installed_ort_providers("cpu") == ("CPUExecutionProvider",)
    assert installed_ort_providers("mps") == ()


def test_the_runtime_exists_only_where_onnxruntime_has_a_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "onnxruntime" in available_runtimes(CPU)
    bare = dataclasses.replace(capabilities(CPU), ort_providers=())
    monkeypatch.setattr(runtime_module, "capabilities", lambda device: bare)
    assert "onnxruntime" not in available_runtimes(CPU)
    assert isinstance(bare, Capabilities) and device_table.ORT_PROVIDERS  # the one table, read here


def test_an_unverified_provider_says_so_where_the_runtime_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_runtime("onnxruntime").label(CPU) == "onnxruntime (CPUExecutionProvider)"
    assert get_runtime("compile").label(CPU) == "compile"
    assert SessionSettings("CPUExecutionProvider", 1).describe().startswith("onnxruntime CPUExecutionProvider, 1 ")
    coreml = dataclasses.replace(capabilities(CPU), ort_providers=("CoreMLExecutionProvider",))
    monkeypatch.setattr(runtime_module, "capabilities", lambda device: coreml)
    assert get_runtime("onnxruntime").label(CPU) == ("onnxruntime (CoreMLExecutionProvider, unverified: not yet run on "
                                                 "a Mac)")
    assert "CoreMLExecutionProvider (unverified: not yet run on a Mac)" in SessionSettings(
        "CoreMLExecutionProvider", 1).describe()


def test_fp32_outputs_match_torch_and_the_session_is_opened_once(residual_spec: ModelSpec, tmp_path: Path) -> None:
    runner = _runner(residual_spec, tmp_path)
    eager = runner.run(runtime="eager")
    result = runner.run(runtime="onnxruntime")
    session = result.prepared
    assert session is not None
    inputs = residual_spec.example_inputs(8)
    with torch.no_grad():
        reference = runner.model(*inputs)
    assert torch.allclose(session(*inputs), reference, atol=1e-5)
    report = result.report
    assert report.metric_value == pytest.approx(eager.report.metric_value, abs=1e-9)
    assert "onnxruntime CPUExecutionProvider" in report.device and "ORT_ENABLE_ALL" in report.device
    assert f"{torch.get_num_threads()} intra-op thread(s)" in report.device
    assert report.extra["runtime_session_seconds"] > 0
    assert result.seconds["runtime_sessions"] > 0 and result.seconds["exports"] > 0
    side = result.objective.side_seconds  # the evaluation's side work, returned with its node
    assert set(side) == {"exports", "runtime_sessions"} and sum(side.values()) <= result.objective.seconds
    assert result.seconds["runtime_sessions"] == side["runtime_sessions"]
    # paid once: the same prefix under the runtime again is a cache hit, the same open session
    assert runner.prepare({}, "onnxruntime") is session
    again = runner.run(runtime="onnxruntime")
    assert again.objective.cached and again.seconds["runtime_sessions"] == 0 and again.objective.side_seconds == {}
    assert again.prepared is None, "a cached evaluation prepared nothing"
    # the recipe names the export as it ran: fusions "auto" resolved (no token inputs: none), cached or not
    for run in (result, again):
        (export,) = run.recipe(residual_spec.name).exports()
        assert export.to_dict()["fusions"] == "none"


def test_int8_metric_is_the_plain_session_metric_and_a_replay_gives_the_same_file(
    digits_spec: ModelSpec, tmp_path: Path
) -> None:
    runner = _runner(digits_spec, tmp_path / "search", [{"stage": "quantize", "method": "int8_dynamic"}])
    result = runner.run(runtime="onnxruntime")
    recipe = Recipe.from_json(result.recipe(digits_spec.name).to_json())
    assert recipe.runtime == "onnxruntime"
    (export,) = recipe.exports()
    assert export.to_dict()["unmirrored"] == "infeasible"
    # the recipe replayed elsewhere: the same file, the same metric
    replay_runner = Runner(recipe_pipeline(recipe.stages), digits_spec, CPU,
                           cache=NodeCache(export_dir=tmp_path / "replay" / "exports"), latency=FAST,
                           work_dir=tmp_path / "replay")
    replay = replay_runner.run({}, recipe.runtime)
    path = Path(replay.exports["export.onnx"].path)
    assert replay.report.metric_value == result.report.metric_value
    first = next((tmp_path / "search" / "exports").glob("*/digits.onnx"))
    assert _sha(path) == _sha(first)
    graph = onnx.load(str(path))
    assert any(node.op_type == "MatMulInteger" or node.op_type == "DynamicQuantizeMatMul" for node in graph.graph.node)
    assert replay.report.size_bytes == path.stat().st_size
    # what a user gets from the file alone, with plain onnxruntime
    plain = onnxruntime.InferenceSession(str(path))
    names = [i.name for i in plain.get_inputs()]

    def run_plain(*inputs: torch.Tensor) -> torch.Tensor:
        feed = {name: t.numpy() for name, t in zip(names, inputs, strict=True)}
        return torch.from_numpy(plain.run(None, feed)[0])

    metric = compute_metric(run_plain, digits_spec.evaluation(), digits_spec.metric, CPU)
    assert metric == pytest.approx(result.report.metric_value, abs=1e-9)


def test_static_int8_is_calibrated_qdq_keeping_the_head_float(digits_spec: ModelSpec, tmp_path: Path) -> None:
    runner = _runner(digits_spec, tmp_path, [{"stage": "quantize", "method": "int8_static_pt2e"}])
    result = runner.run(runtime="onnxruntime")
    path = next((tmp_path / "exports").glob("*/digits.onnx"))
    graph = onnx.load(str(path))
    ops = {node.op_type for node in graph.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    head = [n for n in graph.graph.node if n.op_type in ("Gemm", "MatMul") and any(o.name in n.output for o in
                                                                                   graph.graph.output)]
    assert head and not any(i.endswith("_DequantizeLinear_Output") for i in head[0].input)  # the head stays float
    assert result.report.metric_value > 0.9


def test_a_method_onnxruntime_cannot_mirror_is_infeasible_with_the_reason(
    digits_spec: ModelSpec, tmp_path: Path
) -> None:
    runner = _runner(digits_spec, tmp_path, [{"stage": "quantize", "method": "int8_weight_only"}])
    with pytest.raises(InfeasibleConfig, match=r"int8_weight_only .*: weight-only int8 keeps activations float"):
        runner.run(runtime="onnxruntime")
    assert not list((tmp_path / "exports").glob("*/digits.onnx")), "no float model in place of the int8 one"


class _DataDependentBranch(nn.Module):
    """torch.export cannot trace a Python branch on a tensor value: the ONNX export fails (the branch is
    always taken, so the model itself is deterministic and passes the study's self-check)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        return y if float(y.detach().abs().sum()) >= 0 else -y


def test_a_failed_export_makes_the_runtime_infeasible_and_the_study_goes_on(
    residual_spec: ModelSpec, tmp_path: Path
) -> None:
    model = _DataDependentBranch(residual_spec.build())
    spec = dataclasses.replace(residual_spec, name="branchy", build=lambda: model)
    config = SearchConfig.load(None, pipeline="default", sampler="random", runtimes=("eager", "onnxruntime"),
                               latency_budget="quick", exports="none", disabled=("amp",), seeds=[])
    search = Search(spec, CPU, config, storage=f"sqlite:///{tmp_path / 'optuna.db'}", track=False)
    trials = run_search(search, trials=3).study.trials
    # the baseline (eager), then its recipe under onnxruntime (the runtime sweep): infeasible, with why
    assert trials[0].state.name == "COMPLETE"
    assert trials[1].state.name == "PRUNED" and trials[1].params["runtime"] == "onnxruntime"
    assert "ONNX export (torch.onnx, dynamo) failed" in trials[1].user_attrs[ATTR_REASON]
    assert len(trials) == 3 and trials[2].state.name in ("COMPLETE", "PRUNED")


def test_fused_graphs_declare_the_ort_domain_so_int8_shape_inference_runs() -> None:
    """MiniLM's fused graph had a BiasGelu node without a com.microsoft opset import, and ORT's int8
    quantizers failed in onnx shape inference; the fusions now declare the domain."""
    import onnx
    from onnx import TensorProto, helper

    from paretorch.stages.export.onnx_fusions import ORT_DOMAIN, declare_ort_domain

    node = helper.make_node("BiasGelu", ["x", "b"], ["y"], domain=ORT_DOMAIN)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                            helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(Exception, match="opset import for domain"):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    fixed = declare_ort_domain(model)
    assert [entry.domain for entry in fixed.opset_import].count(ORT_DOMAIN) == 1
    onnx.shape_inference.infer_shapes(fixed, strict_mode=True)
    assert [entry.domain for entry in declare_ort_domain(fixed).opset_import].count(ORT_DOMAIN) == 1
