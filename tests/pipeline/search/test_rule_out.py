"""Rule out before running: a configuration that cannot change the model is not a trial, the check
comes before any costly stage of its chain, it is counted and said, and it is never sampled again."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from torch import nn

from paretorch.pipeline.core.device import capabilities
from paretorch.pipeline.core.model_facts import ModelFacts
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, config_from_dict, registered
from paretorch.pipeline.engine.graph import load_pipeline
from paretorch.pipeline.search import Search, SearchConfig, SeedRecipe, run_search
from paretorch.pipeline.search.config import finished_states
from paretorch.pipeline.search.duplicates import TrialBudget
from paretorch.pipeline.search.objectives import ATTR_REASON, ATTR_SEED
from paretorch.pipeline.search.rule_out import ATTR_RULED_OUT, ATTR_RULED_OUT_COUNTS, RuleOut, study_choices

NEVER = "toy.never cannot change this model"
#: One entry per run of the costly toy stage (a distillation, say).
COSTLY_RUNS: list[str] = []


class CostlyConfig(StageConfig):
    """A costly stage at the head of the chain; never suggested (only a seed runs it)."""

    stage = "toy.costly"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> CostlyConfig | None:
        return None


class KnobConfig(StageConfig):
    """A stage that changes nothing, with a float param: every sampled trial is a distinct recipe."""

    stage = "toy.knob"
    value: float = 0.5

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> KnobConfig | None:
        return cls(value=trial.suggest_float("toy.knob.value", 0.0, 1.0))


class NeverConfig(StageConfig):
    """A stage whose facts say it cannot change the model; its suggest offers what the facts leave."""

    stage = "toy.never"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> NeverConfig | None:
        modes = ctx.offered("toy.never.mode", ["off", "on"],
                            lambda mode: None if mode == "off" else never_rules_out(cls(), ctx.facts))
        return cls() if trial.suggest_categorical("toy.never.mode", modes) == "on" else None


_SCRIPTED = itertools.count()


def _scripted(spec: ModelSpec) -> torch.jit.ScriptModule:
    """The spec's model as TorchScript, under a class of its own: TorchScript registers a class by its
    qualified name, and a second class object of that name in the same process (the fixture module
    imported again, e.g. by unpickling a cached model) cannot be scripted ("Can't redefine method")."""
    model = spec.build()
    model.__class__ = type(f"Scripted{next(_SCRIPTED)}{type(model).__name__}", (type(model),), {})
    return torch.jit.script(model)

def apply_costly(model: nn.Module, config: CostlyConfig, ctx: StageContext) -> nn.Module:
    COSTLY_RUNS.append(config.stage)
    return model


def unchanged(model: nn.Module, config: StageConfig, ctx: StageContext) -> nn.Module:
    return model


def never_rules_out(config: Any, facts: ModelFacts | None) -> str | None:
    return NEVER if facts is not None and facts.of("toy.never") == "nothing to change" else None


def read_never_facts(model: nn.Module, ctx: StageContext) -> str:
    return "nothing to change"


@pytest.fixture(scope="module")
def toy_stages() -> Iterator[None]:
    with registered(Stage(CostlyConfig, apply_costly), Stage(KnobConfig, unchanged),
                    Stage(NeverConfig, unchanged, facts=read_never_facts, rules_out=never_rules_out)):
        yield


def toy_search(spec: ModelSpec, folder: Path, seeds: list[dict[str, Any]]) -> Search:
    pipeline_file = folder / "costly-then-never.yaml"
    pipeline_file.write_text("nodes:\n  - {op: model}\n  - {op: toy.costly}\n  - {op: toy.knob}\n  - {op: toy.never}\n"
                             "  - {name: evaluate, op: evaluate}\n")
    config = SearchConfig.load(None, pipeline=str(pipeline_file), sampler="random", runtimes=("eager",),
                               latency_budget="quick", exports="none", seeds=seeds)
    return Search(spec, torch.device("cpu"), config, storage=f"sqlite:///{folder / 'optuna.db'}", track=False)


COSTLY_THEN_NEVER = ({"stage": "toy.costly"}, {"stage": "toy.never"})


def test_a_ruled_out_configuration_is_no_trial_and_its_costly_prefix_never_runs(
    toy_stages: None, residual_spec: ModelSpec, tmp_path: Path
) -> None:
    search = toy_search(residual_spec, tmp_path, seeds=[{"name": "costly-then-never", "stages": COSTLY_THEN_NEVER}])
    COSTLY_RUNS.clear()
    outcome = run_search(search, trials=3)
    assert COSTLY_RUNS == [], "the check came before the costly stage at the head of the chain"
    trials = outcome.study.trials
    ruled = trials[1]
    assert ruled.user_attrs[ATTR_SEED] == "costly-then-never"
    assert ruled.state.name == "PRUNED" and ruled.values is None
    assert ruled.user_attrs[ATTR_RULED_OUT] == f"toy.never: {NEVER}"
    assert ruled.user_attrs[ATTR_REASON] == f"ruled out: toy.never: {NEVER}"
    assert TrialBudget(3, finished_states()).counted(outcome.study) == 3 and len(trials) == 4, "not counted"
    assert outcome.study.user_attrs[ATTR_RULED_OUT_COUNTS] == {f"toy.never: {NEVER}": 1}
    assert any(note.startswith("1 configuration(s) ruled out before running") and NEVER in note
               for note in outcome.notes)
    sampled = [t for t in trials if ATTR_SEED not in t.user_attrs]
    assert sampled and all(t.distributions["toy.never.mode"].choices == ("off",) for t in sampled), (
        "the ruled-out choice is never sampled")


def test_a_study_that_offered_a_choice_before_keeps_it_and_answers_it_without_running(
    toy_stages: None, residual_spec: ModelSpec, tmp_path: Path
) -> None:
    """A study begun before its facts were read offered "on": Optuna cannot change the choices, so they
    stay, and a sampled "on" is ruled out at once (never run, not counted) instead of failing the trial."""
    search = toy_search(residual_spec, tmp_path, seeds=[])
    study = search.store.open_study()
    search.ensure_baseline(study)
    study.enqueue_trial({"toy.never.mode": "on", "toy.knob.value": 0.25})
    study.enqueue_trial({"toy.never.mode": "on", "toy.knob.value": 0.25})  # identical: ruled out again, not run
    both = optuna.distributions.CategoricalDistribution(["off", "on"])
    earlier = optuna.trial.create_trial(params={"toy.never.mode": "off"}, distributions={"toy.never.mode": both},
                                        state=optuna.trial.TrialState.FAIL)
    study.add_trial(earlier)
    assert study_choices(study.get_trials(deepcopy=False)) == {"toy.never.mode": ("off", "on")}
    outcome = run_search(search, trials=3)  # the failed trial, the baseline and one sampled trial
    states = {t.number: (t.state.name, t.user_attrs.get(ATTR_RULED_OUT)) for t in outcome.study.trials}
    assert states[1] == ("PRUNED", f"toy.never: {NEVER}") and states[2] == ("PRUNED", f"toy.never: {NEVER}")
    assert outcome.study.user_attrs[ATTR_RULED_OUT_COUNTS][f"toy.never: {NEVER}"] >= 2
    assert all(t.state.name != "FAIL" for t in outcome.study.trials if t.number != 3)


def test_facts_a_stage_cannot_read_rule_nothing_out_and_are_said(toy_stages: None, residual_spec: ModelSpec) -> None:
    def unreadable(model: nn.Module, ctx: StageContext) -> str:
        raise RuntimeError("this model hides its blocks")

    stage = Stage(NeverConfig, unchanged, facts=unreadable, rules_out=never_rules_out)
    rules = RuleOut.read(residual_spec.build(), residual_spec, torch.device("cpu"), [stage])
    assert rules.reason([NeverConfig()]) is None
    assert rules.unknown_line() == ("model facts not read (nothing ruled out for these stages): "
                                    "toy.never: RuntimeError: this model hides its blocks")


def test_a_torchscript_model_gets_no_trial_of_a_stage_that_cannot_act_on_it(
    residual_spec: ModelSpec, tmp_path: Path
) -> None:
    scripted = _scripted(residual_spec)
    spec = ModelSpec(name="scripted_mlp", build=lambda: scripted, example_inputs=residual_spec.example_inputs,
                     calibration=residual_spec.calibration, evaluation=residual_spec.evaluation,
                     metric=residual_spec.metric, latency_batch_sizes=(1,), training=residual_spec.training,
                     loss=residual_spec.loss)
    config = SearchConfig.load(None, sampler="random", runtimes=("eager",), latency_budget="quick", exports="none",
                               seeds=[SeedRecipe(name="amp", stages=({"stage": "amp", "dtype": "bfloat16"},))])
    search = Search(spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}", track=False)
    assert search.model.rules.reason([search.plan.pipeline.stage("amp").config_type()]) == (
        "amp: the model is TorchScript: its layers are compiled code that AMP cannot cast layer by layer (its "
        "forward hooks: register_forward_hook is not supported on ScriptModules); give the Python model (a spec) "
        "or a torch.export .pt2 file instead")
    outcome = run_search(search, trials=2)
    trials = outcome.study.trials
    seeded = {t.user_attrs[ATTR_SEED]: t for t in trials if ATTR_SEED in t.user_attrs}
    assert seeded["amp"].state.name == "PRUNED" and seeded["amp"].user_attrs[ATTR_RULED_OUT].startswith(
        "amp: the model is TorchScript"), "answered at once with the user-level reason, not run"
    sampled = {param.split(".")[0] for t in trials for param in t.params}
    assert not sampled & {"prune", "distill", "pack", "amp"}, "no prune, distill, pack or AMP param is sampled"
    assert all(t.state.name != "FAIL" for t in trials)


def test_a_runtime_that_cannot_run_the_chain_rules_the_trial_out_before_its_stages_run(
    residual_spec: ModelSpec, tmp_path: Path
) -> None:
    """ONNX Runtime has no AMP: bf16 AMP under onnxruntime is known impossible before anything runs (no export
    is tried, no trial counted); int8 dynamic under onnxruntime is ORT's own int8 and runs."""
    bf16_on_ort = SeedRecipe(name="bf16-ort", runtime="onnxruntime", stages=({"stage": "amp", "dtype": "bfloat16"},))
    int8_on_ort = SeedRecipe(name="int8-ort", runtime="onnxruntime", stages=({"stage": "quantize",
                                                                             "method": "int8_dynamic"},))
    config = SearchConfig.load(None, sampler="random", runtimes=("eager", "onnxruntime"), latency_budget="quick",
                               exports="none", compose=0, seeds=[bf16_on_ort, int8_on_ort])
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}",
                    track=False)
    amp = search.plan.pipeline.stage("amp").config_type(dtype="bfloat16")
    assert search.model.rules.runtime_reason([None, amp], "onnxruntime") == (
        "runtime onnxruntime cannot run this recipe as trained: AMP (bfloat16): ONNX Runtime runs the exported "
        "float32 graph: the recipe's reduced precision is not mirrored")
    assert search.model.rules.runtime_reason([None, amp], "eager") is None
    outcome = run_search(search, trials=3)
    seeded = {t.user_attrs[ATTR_SEED]: t for t in outcome.study.trials if ATTR_SEED in t.user_attrs}
    assert seeded["bf16-ort"].state.name == "PRUNED"
    assert seeded["bf16-ort"].user_attrs[ATTR_RULED_OUT].startswith("runtime onnxruntime cannot run this recipe")
    assert seeded["bf16-ort"].values is None
    assert seeded["int8-ort"].state.name == "COMPLETE", seeded["int8-ort"].user_attrs
    assert TrialBudget(3, finished_states()).counted(outcome.study) == 3, "the impossible pair is not counted"


def test_compiled_runtimes_are_ruled_out_for_a_torchscript_model(residual_spec: ModelSpec) -> None:
    scripted = _scripted(residual_spec)
    rules = RuleOut.read(scripted, residual_spec, torch.device("cpu"), [])
    assert rules.runtime_reason([], "compile") == (
        "runtime compile cannot run this recipe as trained: a TorchScript model: torch.compile cannot compile a "
        "TorchScript module (use eager)")
    assert rules.runtime_reason([], "onnxruntime") == (
        "runtime onnxruntime cannot run this recipe as trained: a TorchScript model: its export (export.onnx, "
        "through torch.export) cannot trace a TorchScript module (use eager)")
    assert rules.runtime_reason([], "eager") is None


def test_a_study_begun_with_fewer_runtimes_keeps_its_choices_and_its_trials_run(
    residual_spec: ModelSpec, tmp_path: Path
) -> None:
    """A study stored before onnxruntime joined the runtimes (its runtime param fixed to eager/compile) resumes
    with onnxruntime available: sampled trials keep the stored choices (Optuna cannot widen them), and the
    runtime sweep's onnxruntime proposals still run; no trial fails. Every stage node is kept off (an installed
    plugin's too), so each trial is the float model under a sampled runtime: feasible whatever the sampler's random
    stream draws, and the sweep has a feasible stage list to propose under onnxruntime."""
    nodes = tuple(n.name for n in load_pipeline("default").stage_nodes())
    config = SearchConfig.load(None, sampler="random", runtimes=("eager", "onnxruntime"), latency_budget="quick",
                               exports="none", compose=0, seeds=[], disabled=nodes)
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}",
                    track=False)
    study = search.store.open_study()
    older = optuna.distributions.CategoricalDistribution(["eager", "compile"])
    study.add_trial(optuna.trial.create_trial(params={"runtime": "compile"}, distributions={"runtime": older},
                                              state=optuna.trial.TrialState.FAIL))
    outcome = run_search(search, trials=4)
    trials = outcome.study.trials
    assert all(t.state.name != "FAIL" for t in trials[1:]), [t.user_attrs.get(ATTR_REASON) for t in trials]
    sampled = [t for t in trials[1:] if "runtime" in t.distributions]
    assert all(t.distributions["runtime"].choices == ("eager", "compile") for t in sampled)
    ruled = [t.user_attrs[ATTR_RULED_OUT] for t in trials if t.user_attrs.get(ATTR_RULED_OUT, "").startswith("runtime")]
    assert all(r == "runtime compile is not available here (the study offered it before; now: eager, onnxruntime)"
               for r in ruled)
    assert any(t.user_attrs.get("paretorch.runtime") == "onnxruntime" or
               (t.user_attrs.get(ATTR_SEED) or "").startswith("runtime-sweep") for t in trials), (
        "the sweep still proposes onnxruntime")


def test_a_stage_rules_itself_out_after_what_the_stages_before_it_made() -> None:
    """Static PT2E int8 cannot trace a packed model; AMP cannot run over a PT2E graph: both are known before
    the chain runs (the search's compositions crossed them and paid a trial each), the other orders are not."""
    rules = RuleOut(ModelFacts(scripted=False, stages={}, unknown={}), capabilities(torch.device("cpu")))
    pack = config_from_dict({"stage": "pack"})
    static = config_from_dict({"stage": "quantize", "method": "int8_static_pt2e"})
    dynamic = config_from_dict({"stage": "quantize", "method": "int8_dynamic"})
    bf16 = config_from_dict({"stage": "amp", "dtype": "bfloat16", "fp32_layers": []})
    assert "cannot trace what pack made" in (rules.reason([pack, static]) or "")
    assert "AMP cannot run over the int8_static_pt2e graph" in (rules.reason([static, bf16]) or "")
    assert rules.reason([pack, None, static]) == rules.reason([pack, static]), "an off stage in between changes nothing"
    for fine in ([static], [pack, dynamic, bf16], [dynamic, bf16], [pack, bf16]):
        assert rules.reason(fine) is None, fine
