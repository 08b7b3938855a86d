"""The distill stage: recovery of a pruned digits model, the evaluation-data guard,
determinism, the prefix cache, ONNX exports of distilled weights, losses and schedules."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from paretorch.pipeline.api import run_chain
from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig, SpecError
from paretorch.pipeline.core.evaluate import LatencySettings
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply_stage, config_from_dict
from paretorch.pipeline.core.training_data import distillation_data, sample_digests
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.graph import default_pipeline
from paretorch.pipeline.engine.runner import Runner
from paretorch.stages.distill.loop import lr_factor
from paretorch.stages.distill.losses import LossWeights, embedding_loss, logits_loss
from paretorch.stages.distill.stage import DistillConfig
from paretorch.stages.export.onnx import ONNXExportConfig
from paretorch.stages.prune.stage import PruneConfig
from paretorch.stages.quantize.stage import QuantizeConfig

CPU = torch.device("cpu")
#: Structured pruning this deep costs digits about 0.28 accuracy (0.987 -> 0.703, measured).
DAMAGE = PruneConfig(ratio=0.5)
#: Distillation brings it back within this margin of the unpruned model.
MARGIN = 0.01
RECOVER = DistillConfig(steps=100, lr=3e-3)


def accuracy(model: nn.Module, spec: ModelSpec) -> float:
    correct = total = 0
    with torch.no_grad():
        for inputs, labels in spec.evaluation():
            correct += int((model(*inputs).argmax(dim=-1) == labels).sum())
            total += len(labels)
    return correct / total


@pytest.fixture(scope="module")
def pruned(digits_spec: ModelSpec, digits_model: nn.Module) -> nn.Module:
    model: nn.Module = apply_stage(digits_model, DAMAGE, StageContext(digits_spec, CPU))
    return model


def distill(model: nn.Module, config: DistillConfig, spec: ModelSpec,
            teacher: nn.Module | None) -> tuple[nn.Module, StageContext]:
    ctx = StageContext(spec, CPU, source_model=teacher)
    result: nn.Module = apply_stage(model, config, ctx)
    return result, ctx


# --------------------------------------------------------------------------- recovery


def test_distill_recovers_a_pruned_digits_model(digits_spec: ModelSpec, digits_model: nn.Module,
                                                pruned: nn.Module) -> None:
    original, damaged = accuracy(digits_model, digits_spec), accuracy(pruned, digits_spec)
    assert damaged < original - 0.1, "the pruned model should be clearly damaged"
    start = time.perf_counter()
    distilled, ctx = distill(pruned, RECOVER, digits_spec, digits_model)
    seconds = time.perf_counter() - start
    recovered = accuracy(distilled, digits_spec)
    assert recovered >= original - MARGIN, (original, damaged, recovered)
    assert ctx.records["distill.loss_after"] < 0.1 * ctx.records["distill.loss_before"]
    assert ctx.records["distill.data"] == "training" and ctx.records["distill.samples"] == 1200
    assert ctx.records["distill.output_kind"] == "logits" and ctx.records["distill.steps"] == 100
    assert 0 < ctx.records["distill.seconds"] <= seconds


def test_unchanged_model_is_legal_and_starts_at_zero_loss(digits_spec: ModelSpec, digits_model: nn.Module) -> None:
    config = DistillConfig(steps=5, lr=1e-4, task_weight=0.0)
    _, ctx = distill(digits_model, config, digits_spec, digits_model)
    assert ctx.records["distill.loss_before"] == pytest.approx(0.0, abs=1e-6)
    _, scripted = distill(digits_model, config, digits_spec, None)  # no source model: the input is the teacher
    assert scripted.records["distill.loss_before"] == pytest.approx(0.0, abs=1e-6)


def test_same_config_and_input_give_the_same_weights(digits_spec: ModelSpec, digits_model: nn.Module,
                                                     pruned: nn.Module) -> None:
    config = DistillConfig(steps=15, lr=1e-3, batch_size=16)
    first, _ = distill(pruned, config, digits_spec, digits_model)
    second, _ = distill(pruned, config, digits_spec, digits_model)
    other_seed, _ = distill(pruned, config.model_copy(update={"seed": 1}), digits_spec, digits_model)
    a, b, c = first.state_dict(), second.state_dict(), other_seed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a), "the seed should change the sample order"


# --------------------------------------------------------------------------- data


def test_training_data_overlapping_evaluation_is_rejected(digits_spec: ModelSpec, pruned: nn.Module) -> None:
    (leaked, _), *_ = digits_spec.evaluation()
    calibration = digits_spec.calibration()
    spec = dataclasses.replace(digits_spec, training=None, loss=None,
                               training_inputs=lambda: [*calibration, (leaked[0][:5],)])
    message = r"5 of 205 samples of training_inputs\(\) are also in the evaluation set; .* remove them"
    with pytest.raises(SpecError, match=message):
        distillation_data(spec)
    with pytest.raises(SpecError, match=message):
        apply_stage(pruned, DistillConfig(steps=1), StageContext(spec, CPU))


def test_data_source_falls_back_to_training_inputs_then_calibration(digits_spec: ModelSpec) -> None:
    unlabelled = dataclasses.replace(digits_spec, training=None, loss=None)
    data = distillation_data(unlabelled)
    assert data is not None and data.source == "calibration" and data.samples == 200 and data.targets is None
    calibration = digits_spec.calibration()
    data = distillation_data(dataclasses.replace(unlabelled, training_inputs=lambda: calibration[:2]))
    assert data is not None and data.source == "training_inputs" and data.samples == 100


def test_no_training_data_anywhere_is_infeasible(digits_spec: ModelSpec, pruned: nn.Module) -> None:
    spec = dataclasses.replace(digits_spec, training=None, loss=None, calibration=lambda: [])
    with pytest.raises(InfeasibleConfig, match=r"distill with steps=7 needs training data, but spec 'digits' has no"):
        apply_stage(pruned, DistillConfig(steps=7), StageContext(spec, CPU))


def test_sample_digests_tell_samples_apart() -> None:
    batch = (torch.tensor([[1.0, 2.0], [1.0, 2.0], [2.0, 1.0]]), torch.tensor([0, 0, 0]))
    first, second, third = sample_digests([batch])
    assert first == second != third
    assert sample_digests([(batch[0][:1].double(), batch[1][:1])]) != [first]  # dtype counts


def test_output_kind_must_be_known(digits_spec: ModelSpec) -> None:
    with pytest.raises(SpecError, match=r"unknown output_kind 'probabilities': choose one of auto, logits"):
        dataclasses.replace(digits_spec, output_kind="probabilities")


# --------------------------------------------------------------------------- pipeline


def test_default_pipeline_distills_between_prune_and_quantize(default_stages: tuple[list[str], list[str]]) -> None:
    model_stages, _ = default_stages  # from the registry: a plugin's stage may sit anywhere
    chain = [n.name for n in default_pipeline().model_stage_nodes()]
    assert chain == model_stages
    assert chain.index("prune") < chain.index("distill") < chain.index("quantize")
    assert default_pipeline().node("distill").inputs == (chain[chain.index("distill") - 1],)


def test_distilled_prefix_is_a_cache_hit_for_a_second_trial(digits_spec: ModelSpec, digits_model: nn.Module,
                                                            tmp_path: Path) -> None:
    runner = Runner(default_pipeline(), digits_spec, CPU, cache=NodeCache(export_dir=tmp_path / "exports"),
                    latency=LatencySettings(warmup_runs=1, min_runs=3, min_seconds=0), model=digits_model,
                    work_dir=tmp_path / "work")
    prefix = {"prune": DAMAGE, "distill": DistillConfig(steps=10, lr=1e-3)}
    first = runner.run({**prefix, "quantize": QuantizeConfig(method="int8_dynamic")}, exports=False, evaluate=False)
    second = runner.run({**prefix, "quantize": None}, exports=False, evaluate=False)
    assert not first.nodes["distill"].cached and second.nodes["distill"].cached
    assert second.nodes["distill"].value is first.nodes["distill"].value
    assert second.nodes["distill"].records["distill.steps"] == 10
    # The runner hands the stage its source model as the teacher: the pruned student starts far from it.
    assert first.nodes["distill"].records["distill.loss_before"] > 1.0
    assert second.cache_misses == 0 and second.cache_hits == 2  # prune and distill


def test_onnx_export_carries_the_distilled_weights(digits_spec: ModelSpec, digits_model: nn.Module,
                                                   pruned: nn.Module, tmp_path: Path) -> None:
    import onnxruntime

    config = DistillConfig(steps=30, lr=1e-3)
    export = ONNXExportConfig(quantize="none", measure_latency=False)
    chain = run_chain(digits_model, [DAMAGE, config, export], StageContext(digits_spec, CPU, output_dir=tmp_path))
    [result] = chain.exports
    assert chain.records["distill.loss_before"] > 1.0  # run_chain's teacher is the unpruned model
    session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    (images,) = digits_spec.example_inputs(16)
    (output,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    with torch.no_grad():
        distilled, before = chain.model(images), pruned(images)
    assert torch.allclose(torch.from_numpy(output), distilled, rtol=0, atol=1e-4)
    assert (distilled - before).abs().max() > 1e-2, "distillation should have changed the pruned model's outputs"


# --------------------------------------------------------------------------- config, losses, schedule


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValidationError, match=r"steps\n  Input should be greater than or equal to 1"):
        DistillConfig(steps=0)
    with pytest.raises(ConfigError, match=r"lr=-1: Input should be greater than 0"):
        config_from_dict({"stage": "distill", "lr": -1})
    with pytest.raises(ConfigError, match=r"schedule='step'"):
        config_from_dict({"stage": "distill", "schedule": "step"})


def test_layer_map_matches_hidden_layers_or_names_what_is_wrong(digits_spec: ModelSpec, digits_model: nn.Module,
                                                                pruned: nn.Module) -> None:
    kept_width = DistillConfig(steps=3, layer_map=(("classifier.3", "classifier.3"),))
    distill(pruned, kept_width, digits_spec, digits_model)
    narrowed = DistillConfig(steps=3, layer_map=(("features.0", "features.0"),))
    shapes = r"student output \(32, 16, 8, 8\) and teacher output \(32, 32, 8, 8\) differ in shape"
    with pytest.raises(InfeasibleConfig, match=rf"layer_map features.0=features.0: {shapes}"):
        distill(pruned, narrowed, digits_spec, digits_model)
    missing = DistillConfig(steps=3, layer_map=(("features.99", "features.0"),))
    with pytest.raises(InfeasibleConfig, match=r"names student layers the student does not have: features.99"):
        distill(pruned, missing, digits_spec, digits_model)


def test_losses_are_zero_only_for_identical_outputs() -> None:
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(0))
    assert float(logits_loss(logits, logits, temperature=2.0)) == pytest.approx(0.0, abs=1e-6)
    assert float(logits_loss(logits.flip(0), logits, temperature=2.0)) > 0.01
    weights = LossWeights()
    assert float(embedding_loss(logits, logits, weights)) == pytest.approx(0.0, abs=1e-6)
    assert float(embedding_loss(-logits, logits, weights)) > 2.0  # cosine -1: 1 - cos = 2, plus MSE


def test_schedules_warm_up_then_decay() -> None:
    assert lr_factor(0, 100, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(9, 100, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_factor(10, 100, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_factor(55, 100, "cosine", 0.1) == pytest.approx(0.5)
    assert lr_factor(99, 100, "linear", 0.0) == pytest.approx(0.01)
    assert lr_factor(99, 100, "constant", 0.1) == 1.0
    assert all(0 < lr_factor(s, 50, "cosine", 0.2) <= 1 for s in range(49)) and not math.isnan(
        lr_factor(0, 1, "linear", 0.5))


def test_a_time_budget_ends_training_and_the_resolved_config_replays_it(
    digits_spec: ModelSpec, digits_model: nn.Module
) -> None:
    config = DistillConfig(steps=10_000, lr=1e-4, batch_size=16, max_seconds=0.5)
    ctx = StageContext(spec=digits_spec, device=torch.device("cpu"))
    first = apply_stage(digits_model, config, ctx)
    resolved = ctx.resolved_config
    assert isinstance(resolved, DistillConfig) and resolved.max_seconds is None
    assert resolved.stop_step is not None and 1 <= resolved.stop_step < 10_000
    assert ctx.records["distill.steps"] == resolved.stop_step
    assert "time budget of 0.5 s" in ctx.records["distill.cut_short"]
    replay = apply_stage(digits_model, resolved, StageContext(spec=digits_spec, device=torch.device("cpu")))
    for (name, a), (_, b) in zip(first.state_dict().items(), replay.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"{name} differs between the budgeted run and its replay"


def test_stop_step_beyond_steps_is_rejected() -> None:
    with pytest.raises(ValidationError, match="stop_step=5 must be at most steps=4"):
        DistillConfig(steps=4, stop_step=5)
