"""The amp stage: config validation, calibration on the digits CNN (bfloat16 and float16)
and the residual MLP, replay, persistence (deepcopy, compile, export), integer inputs,
infeasible dtypes, upstream prune / quantize, suggest()."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Sequence

import pytest
import torch
from pydantic import ValidationError
from torch import Tensor, nn

import paretorch.pipeline.core.stage_context
from paretorch.pipeline.api import run_chain
from paretorch.pipeline.core.device import Capabilities
from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig
from paretorch.pipeline.core.evaluate import compute_metric, serialized_size_bytes
from paretorch.pipeline.core.spec import ACCURACY, Batch, ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply, config_from_dict, get_stage
from paretorch.stages.amp.stage import AmpConfig

CPU = torch.device("cpu")
DIGITS_LAYERS = {
    "features.0",
    "features.1",
    "features.3",
    "features.4",
    "features.7",
    "features.8",
    "classifier.1",
    "classifier.3",
}
LOOSE, TIGHT = 0.01, 1e-3


@dataclasses.dataclass
class Calibrated:
    """One calibrated run: the input model, the result, and the context it filled."""

    spec: ModelSpec
    source: nn.Module
    model: nn.Module
    ctx: StageContext
    config: AmpConfig
    #: The input model's state as it was before ``apply`` (the session's model may be touched by other tests).
    source_state: dict[str, torch.Tensor]

    @property
    def resolved(self) -> AmpConfig:
        assert isinstance(self.ctx.resolved_config, AmpConfig)
        return self.ctx.resolved_config


def _calibrate(spec: ModelSpec, source: nn.Module, config: AmpConfig) -> Calibrated:
    ctx = StageContext(spec=spec, device=CPU)
    before = {name: tensor.clone() for name, tensor in source.state_dict().items()}
    return Calibrated(spec, source, apply(source, config, ctx), ctx, config, before)


def _relative_error(model: nn.Module, reference: nn.Module, batches: Sequence[Batch]) -> float:
    """||out - ref|| / ||ref|| over all calibration batches, measured here, not by the stage."""
    with torch.no_grad():
        out = torch.cat([model(*batch).float() for batch in batches])
        ref = torch.cat([reference(*batch) for batch in batches])
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


def _accuracy(model: nn.Module, spec: ModelSpec) -> float:
    return compute_metric(model, spec.evaluation(), spec.metric, CPU)


def _param_dtypes(model: nn.Module, layer: str) -> set[torch.dtype]:
    module = dict(model.named_modules())[layer]
    return {t.dtype for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()}


@pytest.fixture(scope="module")
def bf16_loose(digits_spec: ModelSpec, digits_model: nn.Module) -> Calibrated:
    return _calibrate(digits_spec, digits_model, AmpConfig(dtype="bfloat16", error_budget=LOOSE))


@pytest.fixture(scope="module")
def bf16_tight(digits_spec: ModelSpec, digits_model: nn.Module) -> Calibrated:
    return _calibrate(digits_spec, digits_model, AmpConfig(dtype="bfloat16", error_budget=TIGHT))


@pytest.fixture(scope="module")
def fp16_tight(digits_spec: ModelSpec, digits_model: nn.Module) -> Calibrated:
    return _calibrate(digits_spec, digits_model, AmpConfig(dtype="float16", error_budget=TIGHT))


@pytest.fixture(params=["bf16_loose", "bf16_tight", "fp16_tight"])
def calibrated(request: pytest.FixtureRequest) -> Calibrated:
    return request.getfixturevalue(request.param)


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "config",
    [AmpConfig(), AmpConfig(dtype="bfloat16", error_budget=0.003, fp32_layers=("features.0", "classifier"))],
)
def test_config_json_round_trip(config: AmpConfig) -> None:
    data = json.loads(json.dumps(config.to_dict()))
    assert data["stage"] == "amp"
    assert config_from_dict(data) == config


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"error_budget": 0}, r"error_budget=0: Input should be greater than 0"),
        ({"error_budget": 1.5}, r"error_budget=1.5: Input should be less than or equal to 1"),
        ({"dtype": "float8"}, r"dtype='float8': Input should be 'auto', 'float16' or 'bfloat16'"),
        ({"fp32_layers": [""]}, r"fp32_layers.0='': String should have at least 1 character"),
        ({"fp32_layers": ["fc", "fc"]}, r"fp32_layers=\['fc', 'fc'\]: Value error, layers listed twice: fc"),
        ({"budget": 0.1}, r"budget=0.1: Extra inputs are not permitted"),
    ],
)
def test_invalid_values_rejected_naming_field_and_value(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid amp config: " + match):
        config_from_dict({"stage": "amp", **fields})
    with pytest.raises(ValidationError, match=next(iter(fields))):
        AmpConfig(**fields)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- calibration on digits


def test_apply_leaves_input_untouched(bf16_loose: Calibrated) -> None:
    for (name, before), after in zip(bf16_loose.source_state.items(), bf16_loose.source.state_dict().values(),
                                     strict=True):
        assert after.dtype == before.dtype, name
        assert torch.equal(after, before), name
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in bf16_loose.source.modules())
    assert bf16_loose.model is not bf16_loose.source


def test_policy_meets_its_budget_on_calibration_data(calibrated: Calibrated) -> None:
    measured = _relative_error(calibrated.model, calibrated.source, calibrated.spec.calibration())
    assert measured <= calibrated.config.error_budget
    assert measured == pytest.approx(calibrated.ctx.records["amp.output_error"], rel=1e-3, abs=1e-6)
    assert calibrated.resolved.dtype == calibrated.config.dtype
    assert calibrated.resolved.error_budget == calibrated.config.error_budget


def test_fp32_layers_hold_fp32_and_the_others_reduced(calibrated: Calibrated) -> None:
    fp32 = set(calibrated.resolved.fp32_layers or ())
    reduced_dtype = getattr(torch, calibrated.resolved.dtype)
    assert fp32 < DIGITS_LAYERS  # some layers reduced
    for layer in DIGITS_LAYERS:
        assert _param_dtypes(calibrated.model, layer) == {torch.float32 if layer in fp32 else reduced_dtype}, layer


def test_tight_budget_keeps_more_layers_in_fp32(bf16_loose: Calibrated, bf16_tight: Calibrated) -> None:
    loose, tight = bf16_loose.resolved.fp32_layers or (), bf16_tight.resolved.fp32_layers or ()
    assert len(tight) > len(loose)
    assert bf16_tight.ctx.records["amp.output_error"] <= TIGHT < bf16_tight.ctx.records["amp.steps"][0][1]


def test_sensitivity_recorded_for_every_candidate(calibrated: Calibrated) -> None:
    sensitivity = calibrated.ctx.records["amp.sensitivity"]
    assert set(sensitivity) == DIGITS_LAYERS
    assert all(math.isfinite(v) and 0.0 < v < 0.05 for v in sensitivity.values())


def test_most_sensitive_layers_go_back_first(bf16_tight: Calibrated) -> None:
    sensitivity = bf16_tight.ctx.records["amp.sensitivity"]
    fp32 = set(bf16_tight.resolved.fp32_layers or ())
    assert min(sensitivity[n] for n in fp32) >= max(sensitivity[n] for n in DIGITS_LAYERS - fp32)


def test_replay_gives_identical_outputs_without_calibrating(bf16_tight: Calibrated) -> None:
    def no_calibration() -> list[Batch]:
        raise AssertionError("replay must not read calibration data")

    spec = dataclasses.replace(bf16_tight.spec, calibration=no_calibration)
    replay = _calibrate(spec, bf16_tight.source, bf16_tight.resolved)
    assert "amp.sensitivity" not in replay.ctx.records
    assert replay.resolved == bf16_tight.resolved
    for inputs, _ in spec.evaluation():
        with torch.no_grad():
            assert torch.equal(replay.model(*inputs), bf16_tight.model(*inputs))


def test_another_budget_on_the_same_input_model_reuses_the_calibration(
    digits_spec: ModelSpec, digits_model: nn.Module, bf16_loose: Calibrated
) -> None:
    source = copy.deepcopy(digits_model)
    forwards: list[int] = []
    source.register_forward_hook(lambda *_: forwards.append(1))  # kept by the stage's copies
    key = f"test-input-{id(source)}"  # the runner passes its cache key of the input model
    first = StageContext(spec=digits_spec, device=CPU, input_key=key)
    apply(source, AmpConfig(dtype="bfloat16", error_budget=TIGHT), first)
    calibrating = len(forwards)
    forwards.clear()
    second = StageContext(spec=digits_spec, device=CPU, input_key=key)
    apply(source, AmpConfig(dtype="bfloat16", error_budget=LOOSE), second)
    assert (first.records["amp.calibration"], second.records["amp.calibration"]) == ("measured", "reused")
    # The same policy, steps and sensitivities as calibrating afresh (bf16_loose has no key) ...
    assert second.resolved_config == bf16_loose.resolved
    assert second.records["amp.steps"] == bf16_loose.ctx.records["amp.steps"]
    assert second.records["amp.sensitivity"] == bf16_loose.ctx.records["amp.sensitivity"]
    # ... with no calibration forward at all: the tight budget measured every step the
    # loose one needs (what is left: the stage's probe forwards).
    assert len(forwards) <= 3 < calibrating


def test_a_tighter_budget_measures_only_the_missing_steps(
    digits_spec: ModelSpec, digits_model: nn.Module, bf16_tight: Calibrated
) -> None:
    key = f"test-input-{id(bf16_tight)}"
    loose = StageContext(spec=digits_spec, device=CPU, input_key=key)
    apply(digits_model, AmpConfig(dtype="bfloat16", error_budget=LOOSE), loose)
    tight = StageContext(spec=digits_spec, device=CPU, input_key=key)
    apply(digits_model, AmpConfig(dtype="bfloat16", error_budget=TIGHT), tight)
    assert tight.records["amp.calibration"] == "reused"
    assert len(tight.records["amp.steps"]) > len(loose.records["amp.steps"])  # steps were added
    assert tight.resolved_config == bf16_tight.resolved
    assert tight.records["amp.steps"] == bf16_tight.ctx.records["amp.steps"]


def test_replay_accepts_containers_and_rejects_unknown_layers(bf16_loose: Calibrated) -> None:
    replay = _calibrate(bf16_loose.spec, bf16_loose.source, AmpConfig(dtype="bfloat16", fp32_layers=("classifier",)))
    assert replay.resolved.fp32_layers == ("classifier.1", "classifier.3")
    with pytest.raises(
        ConfigError, match=r"fp32_layers names no layer with parameters of this model: head.*features\.0"
    ):
        _calibrate(bf16_loose.spec, bf16_loose.source, AmpConfig(dtype="bfloat16", fp32_layers=("head",)))


def test_output_float32_accuracy_kept_and_size_shrinks(calibrated: Calibrated) -> None:
    inputs = calibrated.spec.example_inputs(4)
    with torch.no_grad():
        assert calibrated.model(*inputs).dtype == torch.float32
    assert _accuracy(calibrated.model, calibrated.spec) >= _accuracy(calibrated.source, calibrated.spec) - 0.01
    assert serialized_size_bytes(calibrated.model) < 0.95 * serialized_size_bytes(calibrated.source)


def test_all_reduced_policy_halves_serialized_size(bf16_loose: Calibrated) -> None:
    assert bf16_loose.resolved.fp32_layers == ()  # measured: bf16 error 0.0026 < 0.01 with every layer reduced
    assert serialized_size_bytes(bf16_loose.model) < 0.55 * serialized_size_bytes(bf16_loose.source)


# --------------------------------------------------------------------------- persistence


@pytest.mark.parametrize("name", ["bf16_loose", "bf16_tight"])
def test_policy_survives_deepcopy_compile_and_export(name: str, request: pytest.FixtureRequest) -> None:
    from torch._dynamo.testing import CompileCounterWithBackend

    calibrated: Calibrated = request.getfixturevalue(name)
    model = calibrated.model
    inputs = calibrated.spec.example_inputs(3)
    with torch.no_grad():
        expected = model(*inputs)
        assert torch.equal(copy.deepcopy(model)(*inputs), expected)

        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(model, backend=counter, fullgraph=True)
        torch.testing.assert_close(compiled(*inputs), expected, atol=1e-2, rtol=1e-2)
        assert compiled(*inputs).dtype == torch.float32
        assert counter.frame_count == 1  # one graph, no break: the casts are traced inline

    exported = torch.export.export(model, inputs)
    assert torch.equal(exported.module()(*inputs), expected)
    casts = [n for n in exported.graph.nodes if n.op == "call_function" and "to" in str(n.target)]
    assert {n.args[1] if len(n.args) > 1 else n.kwargs.get("dtype") for n in casts} >= {torch.bfloat16, torch.float32}
    fp32_layers = calibrated.resolved.fp32_layers or ()
    for key, value in exported.state_dict.items():
        if value.is_floating_point():
            layer = key.rpartition(".")[0]
            assert value.dtype == (torch.float32 if layer in fp32_layers else torch.bfloat16), key


# --------------------------------------------------------------------------- other models and stages


class TokenClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: Tensor, scale: Tensor) -> Tensor:
        return self.head(self.norm(self.embed(ids)).mean(dim=1) * scale)


def test_integer_inputs_are_never_cast() -> None:
    torch.manual_seed(0)
    model = TokenClassifier().eval()
    ids = torch.randint(0, 50, (8, 5))
    scale = torch.ones(8, 1)
    spec = ModelSpec(
        name="tokens",
        build=lambda: model,
        example_inputs=lambda b: (ids[:b], scale[:b]),
        calibration=lambda: [(ids, scale)],
        evaluation=lambda: [((ids, scale), torch.zeros(8, dtype=torch.long))],
        metric=ACCURACY,
    )
    seen: list[torch.dtype] = []
    result = _calibrate(spec, model, AmpConfig(dtype="bfloat16", fp32_layers=()))
    dict(result.model.named_modules())["embed"].register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    with torch.no_grad():
        out = result.model(ids, scale)
    assert seen == [torch.int64]
    assert out.dtype == torch.float32
    assert _param_dtypes(result.model, "embed") == {torch.bfloat16}


class CoupledAttention(nn.Module):
    """q / k / v must share a dtype (one SDPA call); ``out`` feeds a matmul with a float32
    parameter of this container, so it cannot run reduced at all."""

    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value, self.out = (nn.Linear(16, 16) for _ in range(4))
        self.mix = nn.Parameter(torch.randn(16, 4) / 4)

    def forward(self, x: Tensor) -> Tensor:
        attended = nn.functional.scaled_dot_product_attention(self.query(x), self.key(x), self.value(x))
        return (self.out(attended) @ self.mix).mean(dim=1)


def test_coupled_layers_are_grouped_and_unreducible_ones_stay_fp32() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), CoupledAttention()).eval()
    inputs = torch.randn(6, 5, 8)
    spec = ModelSpec(
        name="coupled",
        build=lambda: model,
        example_inputs=lambda b: (inputs[:b],),
        calibration=lambda: [(inputs,)],
        evaluation=lambda: [((inputs,), torch.zeros(6, dtype=torch.long))],
        metric=ACCURACY,
    )
    result = _calibrate(spec, model, AmpConfig(dtype="bfloat16", error_budget=0.05))
    assert result.ctx.records["amp.groups"] == [["1.query", "1.key", "1.value"]]
    assert set(result.ctx.records["amp.pinned"]) == {"1.out"}
    assert "forward with only 1.out reduced failed" in result.ctx.records["amp.pinned"]["1.out"]
    assert set(result.ctx.records["amp.sensitivity"]) == {"0", "1.query", "1.key", "1.value"}
    assert "1.out" in (result.resolved.fp32_layers or ())
    assert _relative_error(result.model, model, [(inputs,)]) <= 0.05
    replay = _calibrate(spec, model, result.resolved)
    with torch.no_grad():
        assert torch.equal(replay.model(inputs), result.model(inputs))


def test_residual_mlp_calibrates_within_budget(residual_spec: ModelSpec) -> None:
    source = residual_spec.build()
    result = _calibrate(residual_spec, source, AmpConfig(dtype="bfloat16", error_budget=2e-3))
    assert set(result.ctx.records["amp.sensitivity"]) == {
        "stem",
        "block1.0",
        "block1.2",
        "block2.0",
        "block2.2",
        "head",
    }
    assert _relative_error(result.model, source, residual_spec.calibration()) <= 2e-3
    assert _accuracy(result.model, residual_spec) >= _accuracy(source, residual_spec) - 0.01


def test_applies_after_prune_and_pins_quantized_layers(digits_spec: ModelSpec, digits_model: nn.Module) -> None:
    from paretorch.stages.prune.stage import PruneConfig
    from paretorch.stages.quantize.stage import QuantizeConfig

    recipe = [PruneConfig(ratio=0.5), QuantizeConfig(method="int8_weight_only", min_weight_elements=0, skip_head=False)]
    upstream_model, _, upstream = run_chain(digits_model, recipe, StageContext(spec=digits_spec, device=CPU))
    ctx = StageContext(spec=digits_spec, device=CPU, upstream=tuple(upstream))
    model = apply(upstream_model, AmpConfig(dtype="bfloat16"), ctx)
    amp = ctx.resolved_config
    assert isinstance(amp, AmpConfig) and amp.fp32_layers is not None
    assert set(ctx.records["amp.pinned"]) == {"classifier.1", "classifier.3"}  # torchao int8 weights
    assert {"classifier.1", "classifier.3"} <= set(amp.fp32_layers)
    assert ctx.records["amp.output_error"] <= amp.error_budget
    assert _param_dtypes(model, "features.0") == {torch.bfloat16}
    assert dict(model.named_modules())["features.0"].out_channels == 16  # pruned from 32
    assert _accuracy(model, digits_spec) >= _accuracy(upstream_model, digits_spec) - 0.01


# --------------------------------------------------------------------------- device capabilities, search space


def _capabilities(reduced: tuple[torch.dtype, ...]) -> Capabilities:
    return Capabilities(kind="testdevice", reduced_dtypes=reduced, fast_dtypes=())


@pytest.mark.parametrize(
    ("reduced", "dtype", "match"),
    [
        ((torch.bfloat16,), "float16", r"torch.float16 is not supported on testdevice"),
        ((), "auto", r"dtype='auto' but testdevice has no reduced floating dtype"),
    ],
)
def test_dtype_the_device_lacks_is_infeasible(
    monkeypatch: pytest.MonkeyPatch, digits_spec: ModelSpec, digits_model: nn.Module, reduced, dtype, match
) -> None:
    monkeypatch.setattr(paretorch.pipeline.core.stage_context, "capabilities", lambda device: _capabilities(reduced))
    with pytest.raises(InfeasibleConfig, match=match):
        _calibrate(digits_spec, digits_model, AmpConfig(dtype=dtype))


def test_suggest_space(monkeypatch: pytest.MonkeyPatch, digits_spec: ModelSpec) -> None:
    import optuna

    fast_bf16 = Capabilities(kind="cpu", reduced_dtypes=(torch.bfloat16, torch.float16), fast_dtypes=(torch.bfloat16,))
    monkeypatch.setattr(paretorch.pipeline.core.stage_context, "capabilities", lambda device: fast_bf16)
    ctx = StageContext(spec=digits_spec, device=CPU)
    off = optuna.trial.FixedTrial({"amp.enabled": False})
    assert AmpConfig.suggest(off, ctx) is None  # type: ignore[arg-type]
    fixed = optuna.trial.FixedTrial({"amp.enabled": True, "amp.dtype": "auto", "amp.error_budget": 0.004})
    expected = AmpConfig(dtype="auto", error_budget=0.004)
    assert AmpConfig.suggest(fixed, ctx) == expected  # type: ignore[arg-type]
    study = optuna.create_study()
    study.enqueue_trial({"amp.enabled": True})
    trial = study.ask()
    config = AmpConfig.suggest(trial, ctx)
    assert config is not None and 1e-3 <= config.error_budget <= 5e-2
    dtypes, budget = trial.distributions["amp.dtype"], trial.distributions["amp.error_budget"]
    assert isinstance(dtypes, optuna.distributions.CategoricalDistribution)
    assert dtypes.choices == ("auto", "bfloat16")  # float16 runs on this CPU but is slow: not offered
    assert isinstance(budget, optuna.distributions.FloatDistribution)
    assert (budget.low, budget.high, budget.log) == (1e-3, 5e-2, True)


def test_no_amp_trial_without_a_fast_reduced_dtype(monkeypatch: pytest.MonkeyPatch, digits_spec: ModelSpec) -> None:
    import optuna

    slow = Capabilities(kind="cpu", reduced_dtypes=(torch.bfloat16, torch.float16), fast_dtypes=())
    monkeypatch.setattr(paretorch.pipeline.core.stage_context, "capabilities", lambda device: slow)
    study = optuna.create_study()
    study.enqueue_trial({"amp.enabled": True})
    trial = study.ask()
    assert AmpConfig.suggest(trial, StageContext(spec=digits_spec, device=CPU)) is None
    assert trial.params == {}  # nothing suggested: no trial is spent on it
    stage = get_stage("amp")
    reason = stage.not_worthwhile(AmpConfig(), slow)
    assert reason == "bfloat16 is not faster than float32 on cpu (no fast reduced dtype)"
    fast = Capabilities(kind="cpu", reduced_dtypes=(torch.bfloat16,), fast_dtypes=(torch.bfloat16,))
    assert stage.not_worthwhile(AmpConfig(), fast) is None


def test_scripted_chains_reuse_the_calibration(digits_spec: ModelSpec, digits_model: nn.Module) -> None:
    """run_chain is the runner: it keys the input model, so a second calibration of the same
    model and dtype (another error budget) reuses the sensitivities."""
    first = StageContext(spec=digits_spec, device=CPU)
    run_chain(digits_model, [AmpConfig(dtype="bfloat16", error_budget=0.02)], first)
    second = StageContext(spec=digits_spec, device=CPU)
    run_chain(digits_model, [AmpConfig(dtype="bfloat16", error_budget=0.005)], second)
    assert second.records["amp.calibration"] == "reused"
