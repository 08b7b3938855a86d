"""The trial record: one object per trial, written to Optuna and MLflow alike, with what its stages recorded
(output-error budgets logged next to the task metric's verdict, the AMP sensitivity table of each calibrated trial)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import torch
from mlflow import MlflowClient

from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.run_result import NodeResult
from paretorch.pipeline.search import Search, SearchConfig, run_search
from paretorch.pipeline.search.record import COMPLETE, FAIL, PRUNED, TrialRecord, budget_metrics, sensitivity_tables
from paretorch.stages.amp.stage import AmpConfig
from paretorch.stages.export.onnx import ONNXExportConfig
from paretorch.stages.prune.stage import PruneConfig
from paretorch.stages.quantize.stage import QuantizeConfig


def _complete_record(number: int = 0) -> TrialRecord:
    requested = {"prune": None, "amp": AmpConfig(dtype="auto", error_budget=0.01)}
    resolved = AmpConfig(dtype="bfloat16", error_budget=0.01, fp32_layers=("head",))
    return TrialRecord(number=number, state=COMPLETE, runtime="compile", configs=requested,
                       recipe=Recipe(stages=(resolved,), runtime="compile", model="digits"),
                       metrics={"accuracy": 0.99, "metric_drop": 0.001}, seconds={"stages": 1.5},
                       cache={"hits": 1, "misses": 2}, seed="amp-only")


def test_params_are_the_resolved_recipe_and_off_stages_say_so() -> None:
    params = _complete_record().params()
    assert params["amp.dtype"] == "bfloat16" and params["amp.fp32_layers"] == '["head"]'
    assert params["prune"] == "off" and params["runtime"] == "compile"


def test_a_resolved_auto_keeps_the_request_beside_it() -> None:
    """What ran (bf16, the fusions applied) is the param; what was asked (auto) sits beside it, once."""
    params = _complete_record().params()
    assert params["amp.dtype.requested"] == "auto" and params["amp.fp32_layers.requested"] == "null"  # calibrated
    assert "amp.error_budget.requested" not in params and "runtime.requested" not in params
    record = TrialRecord(number=1, state=COMPLETE, runtime="onnxruntime", configs={"export.onnx": ONNXExportConfig()},
                         recipe=Recipe(stages=(ONNXExportConfig(fusions="none"),), runtime="onnxruntime"))
    assert record.params()["export.onnx.fusions"] == "none"
    assert record.params()["export.onnx.fusions.requested"] == "auto"


def test_an_infeasible_trial_logs_what_it_asked_for() -> None:
    record = TrialRecord(number=3, state=PRUNED, runtime="eager", configs={"prune": PruneConfig(ratio=0.5)},
                         infeasible="prune: forward failed")
    assert record.params()["prune.ratio"] == "0.5"
    assert record.tracking_tags({"device": "cpu"})["infeasible_reason"] == "prune: forward failed"
    assert record.stages_key is None


def test_optuna_attributes_read_back_as_the_same_record() -> None:
    study = optuna.create_study()
    trial = study.ask()
    record = _complete_record(trial.number)
    for key, value in record.user_attrs().items():
        trial.set_user_attr(key, value)
    trial.set_user_attr("paretorch.seed", "amp-only")
    study.tell(trial, 1.0)
    back = TrialRecord.from_trial(study.trials[0])
    assert back.recipe == record.recipe and back.configs == record.configs
    assert (back.metrics, back.seconds, back.cache, back.seed, back.runtime) == (
        record.metrics, record.seconds, record.cache, record.seed, record.runtime)
    assert back.params() == record.params()


def test_mlflow_params_of_a_calibrated_amp_trial_are_resolved(residual_spec: ModelSpec, tmp_path: Path) -> None:
    """The MLflow child run of an AMP trial shows the dtype and float32 layers calibration chose; it is named by its
    number and short recipe, its recipe tag claims no export (none ran); the parent lists the runtimes the device
    offered (CUDA graphs asked for, not on a CPU)."""
    config = SearchConfig.load(None, sampler="random", runtimes=("eager", "compile_cudagraphs"),
                               latency_budget="quick", exports="none",
                               seeds=[{"name": "amp-only", "stages": [{"stage": "amp"}]}])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'optuna.db'}",
                    tracking_uri=uri)
    outcome = run_search(search, trials=2)
    # AMP under eager on this tiny CPU model may be decided far behind by the latency probe (not scored): its run
    # still shows the recipe that ran, resolved
    assert outcome.study.trials[1].state.name in (COMPLETE, "PRUNED")
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("paretorch/residual_mlp").experiment_id],
                              filter_string="tags.seed = 'amp-only'")
    [run] = runs
    assert run.data.params["amp.dtype"] in ("bfloat16", "float16")
    assert "amp.fp32_layers" in run.data.params and run.data.params["amp.fp32_layers"] != "null"
    assert run.data.params["prune"] == "off"
    assert run.info.run_name.startswith("001 bf16") or run.info.run_name.startswith("001 fp16"), run.info.run_name
    assert run.info.run_name.endswith(" | eager") and "->" not in run.data.tags["recipe"], run.data.tags["recipe"]
    [parent] = client.search_runs([run.info.experiment_id], filter_string="tags.`paretorch.role` = 'study'")
    assert parent.data.params["search.runtimes"] == "['eager']"


def test_a_run_is_named_by_its_number_and_short_recipe() -> None:
    record = TrialRecord(number=16, state=COMPLETE, runtime="onnxruntime", configs={},
                         recipe=Recipe(stages=(PruneConfig(ratio=0.3), QuantizeConfig(method="int8_static_pt2e"),
                                               ONNXExportConfig()), runtime="onnxruntime", model="digits"))
    assert record.run_name() == "016 prune 0.3 + int8s | ort"
    assert record.tracking_tags({})["recipe"].endswith("| onnxruntime"), "no export ran with the trial"
    assert record.tracking_tags({}, exports_ran=True)["recipe"].endswith("| -> onnx")
    asked = TrialRecord(number=3, state=PRUNED, runtime="eager", configs={"prune": PruneConfig(ratio=0.5), "amp": None})
    assert asked.run_name() == "003 prune 0.5 | eager"


def test_reasons_name_what_went_wrong() -> None:
    error = "Traceback ...\nRuntimeError: boom\nwhile running pipeline node 'x'\n"
    failed = TrialRecord(number=2, state=FAIL, runtime="eager", error=error)
    assert failed.reason() == "failed: RuntimeError: boom"
    assert failed.tracking_tags({})["error"] == "RuntimeError: boom"
    repeat = TrialRecord(number=5, state=PRUNED, runtime="eager", repeat_of=1)
    assert repeat.tracking_tags({})["reason"] == "repeat of trial 1" and repeat.user_attrs()["paretorch.repeat_of"] == 1
    over = TrialRecord(number=3, state=COMPLETE, runtime="eager", feasible=False, over_drop="drop 0.1 > allowed 0.01")
    assert over.tracking_tags({})["feasible"] == "false"
    assert over.user_attrs()["paretorch.reason"] == "over the allowed drop: drop 0.1 > allowed 0.01"


def test_a_budget_that_kept_layers_float_is_logged_with_the_task_headroom() -> None:
    stages = [
        PruneConfig(ratio=0.3),
        QuantizeConfig(method="int8_dynamic", fallback_budget=0.01, float_layers=("a.0", "b.1")),
        AmpConfig(dtype="bfloat16", error_budget=0.02, fp32_layers=("head",)),
    ]
    metrics = budget_metrics(stages, headroom=0.004)  # drop 0.004 under the allowed one
    assert metrics["quantize.fallback_budget"] == pytest.approx(0.01)
    assert metrics["quantize.fallback_budget_float_layers"] == 2
    assert metrics["amp.error_budget"] == pytest.approx(0.02)
    assert metrics["amp.error_budget_float_layers"] == 1
    assert metrics["drop_headroom"] == pytest.approx(0.004)


def test_no_budget_held_logs_nothing() -> None:
    stages = [QuantizeConfig(method="int8_dynamic"), QuantizeConfig(method="int8_dynamic", fallback_budget=0.01,
                                                                      float_layers=())]
    assert budget_metrics(stages, headroom=-0.5) == {}


def test_sensitivity_table_lists_costliest_layers_first_and_what_stayed_float() -> None:
    amp = NodeResult(
        "amp", "model", "k1", None, resolved=AmpConfig(dtype="bfloat16", fp32_layers=("classifier.1",)),
        records={"amp.sensitivity": {"features.0": 0.001, "classifier.1": 0.02, "classifier.3": 0.004},
                 "amp.pinned": {"classifier.3": "output layer"}},
    )
    tables = sensitivity_tables({"prune": NodeResult("prune", "model", "k0", None), "amp": amp})
    assert list(tables) == ["amp_sensitivity.csv"]
    assert tables["amp_sensitivity.csv"].splitlines() == [
        "layer,error_alone_reduced,kept_float32,why",
        "classifier.1,0.02,true,",
        "classifier.3,0.004,false,output layer",
        "features.0,0.001,false,",
    ]
