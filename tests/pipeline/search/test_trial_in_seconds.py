"""A search that spends its time finding, not measuring (issue 32), on a fake clock:

* the latency probe: a 14x slower trial is decided in its first rounds and never scored;
* multi-fidelity: a fast trial with a wrecked metric is decided on a subset and never scored in full, while the
  front trial always is;
* the machine probe orders and prunes the presets with injected throughputs;
* dead ends are not proposed again; ``time_to_result`` is written and rises.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import ClassVar

import optuna
import pytest
import torch
from mlflow.tracking import MlflowClient
from torch import Tensor, nn

from paretorch.pipeline.core.machine_probe import (
    MIN_ROUNDS,
    Gain,
    MachineProbe,
    paired_gain,
    probe_machine,
    probe_reason,
    stage_precision,
)
from paretorch.pipeline.core.paired import MachineLoad, PairedLatency, Timed
from paretorch.pipeline.core.runtimes.base import ExportHandle, Runtime
from paretorch.pipeline.core.runtimes.registry import declared_probes, registered_runtime
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, registered
from paretorch.pipeline.core.timing import use_clock
from paretorch.pipeline.search import Search, SearchConfig
from paretorch.pipeline.search.config import Preset, SeedRecipe
from paretorch.pipeline.search.dead_ends import RuntimeGains
from paretorch.pipeline.search.objectives import ATTR_FEASIBLE, ATTR_INFEASIBLE, ATTR_METRICS
from paretorch.pipeline.search.presets import initial_queue, preset_seeds
from paretorch.pipeline.search.probe import BEHIND_FRONT, FrontReferences, behind_front
from paretorch.pipeline.search.record import ATTR_FIDELITY, FULL_FIDELITY, PROBE_FIDELITY, TrialRecord
from paretorch.pipeline.search.subset import OVER_ON_SUBSET
from paretorch.pipeline.search.time_to_result import best_so_far, time_to_reach, time_to_result
from paretorch.pipeline.tracking.tracker import experiment_name
from tests.fake_clock import SimulatedClock
from tests.pipeline.search.conftest import run_on_fake_clock, trials_by_seed

#: True latency (ms) per label: the baseline 1.0, a 4x trial, a 14x slower one, a fast one with a wrecked metric.
TRUE_MS = {None: 1.0, "fast": 0.25, "slow": 14.0, "scrambled": 0.5}


class ScrambleConfig(StageConfig):
    """Rolls the class logits by one: fast (for the fake clock) and wrong."""

    stage = "toy.scramble"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> ScrambleConfig | None:
        return None


class Scrambled(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.paretorch_label = "scrambled"

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x).roll(1, dims=-1)


def apply_scramble(model: nn.Module, config: ScrambleConfig, ctx: StageContext) -> nn.Module:
    return Scrambled(model)


class LabelTimer:
    def warm_up(self, sides: Sequence[Timed]) -> None:
        pass

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        return [TRUE_MS[getattr(inspect.unwrap(fn), "paretorch_label", None)] for fn, _ in sides]


def many_rows(spec: ModelSpec) -> ModelSpec:
    """The spec with its evaluation tiled to 1,280 rows in batches of 128 (room for a 25 % subset)."""
    (inputs,), labels = spec.evaluation()[0]
    big_x, big_y = inputs.repeat(20, 1), labels.repeat(20)
    batches = [((big_x[i:i + 128],), big_y[i:i + 128]) for i in range(0, 1280, 128)]
    return ModelSpec(name="residual_rows", build=spec.build, example_inputs=spec.example_inputs,
                     calibration=spec.calibration, evaluation=lambda: batches, metric=spec.metric,
                     latency_batch_sizes=spec.latency_batch_sizes)


@pytest.fixture(scope="module")
def quick_search(residual_spec: ModelSpec, tag_stage: Stage,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Search]:
    folder = tmp_path_factory.mktemp("seconds")
    pipeline_file = folder / "scrambled.yaml"
    pipeline_file.write_text("nodes:\n  - {op: model}\n  - {op: toy.tag}\n  - {op: toy.scramble}\n"
                             "  - {name: evaluate, op: evaluate}\n")
    seeds = [{"name": "fast", "stages": [{"stage": "toy.tag", "label": "fast"}]},
             {"name": "slow", "stages": [{"stage": "toy.tag", "label": "slow"}]},
             {"name": "scrambled", "stages": [{"stage": "toy.scramble"}]}]
    config = SearchConfig.load(None, pipeline=str(pipeline_file), sampler="random", runtimes=("eager",),
                               latency_budget="quick", exports="none", seeds=seeds, presets=())
    with registered(tag_stage), registered(Stage(ScrambleConfig, apply_scramble)):
        yield run_on_fake_clock(many_rows(residual_spec), config, folder, LabelTimer(), trials=4)


by_seed = trials_by_seed


def test_a_far_slower_trial_is_decided_by_the_probe_and_never_scored(quick_search: Search) -> None:
    slow = by_seed(quick_search)["slow"]
    assert slow.state == optuna.trial.TrialState.PRUNED
    assert slow.user_attrs[ATTR_INFEASIBLE].startswith(BEHIND_FRONT)
    assert slow.user_attrs[ATTR_FIDELITY] == PROBE_FIDELITY
    metrics = slow.user_attrs[ATTR_METRICS]
    assert metrics["latency_rounds"] == 6 and metrics["speedup"] == pytest.approx(1 / 14)
    assert "accuracy" not in metrics, "its metric was never computed"
    assert "stopped by the latency probe" in quick_search.output  # type: ignore[attr-defined]


def test_a_trial_over_the_drop_on_the_subset_is_never_scored_in_full(quick_search: Search) -> None:
    trials = by_seed(quick_search)
    scrambled = trials["scrambled"]
    assert scrambled.state == optuna.trial.TrialState.PRUNED
    assert scrambled.user_attrs[ATTR_INFEASIBLE].startswith(OVER_ON_SUBSET)
    assert scrambled.user_attrs[ATTR_FIDELITY] == "subset 384 of 1280 rows"
    assert "accuracy" not in scrambled.user_attrs[ATTR_METRICS] and scrambled.values is None
    fast = trials["fast"]
    assert fast.user_attrs[ATTR_FIDELITY] == FULL_FIDELITY and fast.user_attrs[ATTR_FEASIBLE]
    front = [t.number for t in quick_search.outcome.pareto]  # type: ignore[attr-defined]
    assert front == [fast.number], "the front trial was scored in full"


def test_its_latency_is_its_probe_one_number_per_fact(quick_search: Search) -> None:
    metrics = by_seed(quick_search)["fast"].user_attrs[ATTR_METRICS]
    assert metrics["speedup"] == pytest.approx(4.0)
    # The objective is the probe's measurement of the workload (its paired rounds, per batch) on the baseline's scale;
    # the model call alone, timed in the evaluation, is a fact of its own beside it.
    per_batch = 0.25 / quick_search.model.latency.workload.batches  # type: ignore[union-attr]  # the fake's 0.25 ms a call
    assert metrics["latency_ms_b1_via_speedup"] == pytest.approx(metrics["latency_ms_paired"])
    assert metrics["latency_ms_paired"] == pytest.approx(per_batch)
    assert metrics["latency_ms_p50_b1"] > 0 and metrics["model_call_speedup"] > 0


def test_time_to_result_is_written_and_rises(quick_search: Search) -> None:
    outcome = quick_search.outcome  # type: ignore[attr-defined]
    curve = time_to_result(outcome.results)
    assert curve and all(a[0] <= b[0] and a[1] < b[1] for a, b in itertools.pairwise(curve))
    assert curve[-1][1] == pytest.approx(4.0, rel=1e-3)
    assert outcome.found.startswith(f"time to result: the front's lead, trial {outcome.best[0].number} (4.00x), "
                                    "found after ")
    client = MlflowClient(quick_search.store.tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name(quick_search.plan.spec.name))
    parent = client.get_run(outcome.parent_run_id)
    assert parent.info.experiment_id == experiment.experiment_id
    history = client.get_metric_history(outcome.parent_run_id, "time_to_result_speedup")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx([p[1] for p in curve], rel=1e-3)


# --------------------------------------------------------------------------- the pieces, alone


def paired(speedup: float, ci: tuple[float, float], stopped: str = "decided") -> PairedLatency:
    return PairedLatency(1.0, 1.0 / speedup, speedup, ci, 6, MachineLoad(0.0, 1), stopped=stopped)


def test_the_probe_stops_only_a_trial_behind_the_front_and_its_own_runtime() -> None:
    front = FrontReferences((1.0, 4.0), top=(3, 4.0))
    assert behind_front(paired(0.07, (0.06, 0.08)), front, "eager") is not None
    assert behind_front(paired(1.35, (1.3, 1.4)), front, "eager") is None, "pruning that pays under eager: scored"
    assert behind_front(paired(2.0, (1.9, 2.1)), front, "onnxruntime", plain=3.5) is not None
    assert behind_front(paired(0.9, (0.86, 0.93), stopped="settled"), front, "eager") is not None, "settled, clear"
    assert behind_front(paired(0.07, (0.06, 0.08), stopped="round limit"), front, "eager") is None, "not decided"
    assert behind_front(paired(0.07, (0.06, 0.08)), FrontReferences(), "eager") is None, "no front yet"
    tied = paired(1.0, (0.97, 1.02))
    assert behind_front(tied, front, "compile") is None, "stages that cost nothing under compile: scored"
    reason = behind_front(tied, front, "compile", unchanged=True)
    assert reason is not None and "a runtime alone on the unchanged model" in reason, "fp32 under compile at 1.0x"


def test_a_runtime_alone_tied_with_the_baseline_is_decided_against_the_front_only() -> None:
    front = FrontReferences((1.0, 3.34), top=(1, 3.34))
    near_one = (0.92, 0.99)  # fp32 under compile: a tie with 1.0x, far below the front
    assert not front.stop_rule().decided(near_one), "a changed model's tie with the baseline runs every round"
    assert front.stop_rule(unchanged=True).decided(near_one), "the unchanged model: only the front's speed-up counts"
    assert not front.stop_rule(unchanged=True).decided((3.2, 3.5)), "a tie with the front still runs every round"
    assert FrontReferences().stop_rule(unchanged=True).references == (1.0,), "no front yet: the baseline"


def record(number: int, runtime: str, speedup: float, stages: dict[str, StageConfig | None]) -> TrialRecord:
    return TrialRecord(number=number, state="PRUNED", runtime=runtime, configs=stages, metrics={"speedup": speedup})


def test_a_runtime_far_behind_is_a_dead_end_unless_the_estimate_can_win() -> None:
    gains = RuntimeGains()
    gains.add(record(1, "onnxruntime", 4.2, {}), feasible=True)
    gains.add(record(2, "compile", 0.7, {}), feasible=True)
    gains.add(record(3, "onnxruntime", 5.5, {"scramble": ScrambleConfig()}), feasible=True)
    assert gains.fastest == 5.5
    estimate = gains.estimate(5.5, "onnxruntime", "compile")
    assert estimate == pytest.approx(5.5 * 0.7 / 4.2) and gains.dead_end(estimate)
    assert not gains.dead_end(gains.estimate(5.5, "compile", "onnxruntime")), "the fast runtime stays"
    assert not gains.dead_end(gains.estimate(5.5, "onnxruntime", "openvino")), "no measurement: no estimate"
    assert gains.dead_end(gains.plain_estimate(1.2, "compile")) and not gains.dead_end(
        gains.plain_estimate(1.2, "onnxruntime"))


def test_a_proposal_enqueued_before_its_runtime_was_measured_is_ruled_out_when_it_starts() -> None:
    """A sweep or a composition carries its estimate onto its trial; what was measured since it was enqueued (the
    runtime alone at 0.7x) makes it a dead end when the trial starts, before any stage runs."""
    sweep = SeedRecipe(name="runtime-sweep-of-trial-3", runtime="compile", stages=({"stage": "prune"},),
                       estimate={"speedup": 5.5, "under": "onnxruntime"})
    assert sweep.trial_attrs() == {"paretorch.estimate": {"speedup": 5.5, "under": "onnxruntime"}}
    assert SeedRecipe(name="prune-depth").trial_attrs() == {} and "estimate" not in SeedRecipe(
        name="prune-depth").model_dump(), "config seeds dump (and name their study) as before"
    gains = RuntimeGains()
    gains.add(record(1, "onnxruntime", 4.2, {}), feasible=True)
    gains.add(record(3, "onnxruntime", 5.5, {"scramble": ScrambleConfig()}), feasible=True)
    assert gains.dead_end_reason(sweep.estimate or {}, "compile") is None, "compile alone not measured yet"
    gains.add(record(4, "compile", 0.7, {}), feasible=True)
    reason = gains.dead_end_reason(sweep.estimate or {}, "compile")
    assert reason is not None and "estimated 0.92x under compile" in reason
    assert gains.dead_end_reason({"gain": 1.2}, "compile") is not None
    assert gains.dead_end_reason({"gain": 1.2}, "onnxruntime") is None


PRESETS = (Preset(name="bf16", stages=({"stage": "amp", "dtype": "bfloat16", "fp32_layers": []},)),
           Preset(name="int8-static", stages=({"stage": "quantize", "method": "int8_static_pt2e"},),
                  runtimes=("openvino", "onnxruntime")),
           Preset(name="fp32", stages=()))


#: Which engine each runtime of these tests runs (what their declarations say: ``Runtime.engine``).
RUNTIME_ENGINES = {"eager": "torch", "compile": "torch", "onnxruntime": "onnxruntime", "openvino": "openvino"}


def cpu_probe(engines: dict[str, Callable[[], dict[str, float]]]) -> MachineProbe:
    """A probe of injected (exact) gains, engines mapped as the built-in runtimes declare them."""
    return probe_machine(torch.device("cpu"), engines, RUNTIME_ENGINES)


def plan(probe: MachineProbe) -> list[str]:
    """The presets in the order they run: the first ones, then those that wait for the first compositions."""
    seeds = preset_seeds(PRESETS, ["eager", "onnxruntime", "openvino"],
                         lambda stages, runtime: probe_reason(probe, stages, runtime), probe)
    return [s.name.removeprefix("preset-") for s in (*seeds.seeds, *seeds.later)]


def test_where_int8_pays_the_cheap_seeds_come_before_the_other_presets_and_the_costly_seeds() -> None:
    probe = cpu_probe(engines={"torch": lambda: {"bf16": 0.9, "int8": 2.8}, "onnxruntime": lambda: {"int8": 1.9},
                               "openvino": lambda: {"bf16": 1.0, "int8": 0.8}})
    presets = preset_seeds(PRESETS, ["eager", "onnxruntime", "openvino"], lambda stages, runtime: None, probe)
    assert [s.name for s in presets.seeds] == ["preset-int8-static@onnxruntime"], "int8 where it pays, alone first"
    depth = SeedRecipe(name="prune-depth", stages=({"stage": "prune", "method": "depth", "ratio": 0.1},))
    distill = SeedRecipe(name="prune-distill", stages=({"stage": "prune", "ratio": 0.3},
                                                       {"stage": "distill", "max_seconds": 300}))
    now, later = initial_queue(presets, [distill, depth])
    assert [s.name for s in now] == ["preset-int8-static@onnxruntime", "prune-depth"]
    assert [s.name for s in later][-1] == "prune-distill" and "preset-int8-static@openvino" in {s.name for s in later}
    packed = (Preset(name="fp32-packed", stages=({"stage": "pack"},), runtimes=("compile",)),
              Preset(name="bf16-packed", stages=({"stage": "pack"}, {"stage": "amp", "dtype": "bfloat16"}),
                     runtimes=("compile",)))
    compiled = preset_seeds((*PRESETS, *packed), ["eager", "compile", "onnxruntime"], lambda stages, runtime: None,
                            probe)
    first = [s.name for s in compiled.seeds]
    assert "preset-fp32-packed@compile" in first, "pack (float32, structural) multiplies with int8: measured first"
    assert not {"preset-bf16-packed@compile", "preset-fp32@compile"} & set(first), "precision and runtime alone wait"
    nothing = cpu_probe(engines={"torch": lambda: {"bf16": 0.3, "int8": 0.9}, "onnxruntime": lambda: {"int8": 0.9},
                                 "openvino": lambda: {"bf16": 1.0, "int8": 0.8}})
    plain = preset_seeds(PRESETS, ["eager", "onnxruntime", "openvino"], lambda stages, runtime: None, nothing)
    now, later = initial_queue(plain, [distill, depth])
    assert later == [] and [s.name for s in now][-2:] == ["prune-distill", "prune-depth"], "nothing waits: config order"


def test_where_int8_pays_under_several_runtimes_its_first_runtime_alone_comes_before_the_compositions() -> None:
    probe = cpu_probe(engines={"torch": lambda: {"bf16": 0.9, "int8": 2.8}, "onnxruntime": lambda: {"int8": 1.9},
                               "openvino": lambda: {"bf16": 1.0, "int8": 1.6}})
    presets = preset_seeds(PRESETS, ["eager", "onnxruntime", "openvino"], lambda stages, runtime: None, probe)
    assert [s.name for s in presets.seeds] == ["preset-int8-static@openvino"], "the preset's own runtime order"
    assert "preset-int8-static@onnxruntime" in {s.name for s in presets.later}, "its other runtimes wait"


def test_where_bf16_and_int8_both_pay_each_leads_under_its_first_paying_runtime() -> None:
    """A GPU: bfloat16 pays as int8 does; the packed bf16 preset is among the first trials, not after the
    compositions (it read 0.00x once a first call decided, and the search never ran ``pack + bf16``)."""
    gpu = probe_machine(torch.device("cpu"), {"torch": lambda: {"bf16": 6.0, "fp16": 6.1, "int8": 9.0}},
                        {"compile": "torch", "compile_cudagraphs": "torch", "eager": "torch"})
    presets = (*PRESETS, Preset(name="bf16-packed", stages=({"stage": "pack"}, {"stage": "amp", "dtype": "bfloat16"}),
                                runtimes=("compile_cudagraphs", "compile")),
               Preset(name="int8-dynamic", stages=({"stage": "quantize", "method": "int8_dynamic"},),
                      runtimes=("compile_cudagraphs",)))
    first = [s.name for s in preset_seeds(presets, ["eager", "compile", "compile_cudagraphs"],
                                          lambda stages, runtime: None, gpu).seeds]
    assert first == ["preset-bf16@compile", "preset-bf16-packed@compile_cudagraphs",
                     "preset-int8-dynamic@compile_cudagraphs"], "every paying precision, its first runtime"


def test_the_machine_probe_orders_and_prunes_the_presets() -> None:
    avx512 = cpu_probe(engines={
        "torch": lambda: {"bf16": 0.9, "int8": 2.8}, "onnxruntime": lambda: {"int8": 1.9},
        "openvino": lambda: {"bf16": 1.0, "int8": 1.15}})
    assert plan(avx512)[:2] == ["int8-static@openvino", "int8-static@onnxruntime"], "int8 first where it pays"
    assert "bf16@eager" not in plan(avx512), "bf16 runs 0.9x float32 with confidence: dropped"
    paying = cpu_probe(engines={"torch": lambda: {"bf16": 3.0, "int8": 2.8}, "onnxruntime": lambda: {"int8": 1.9},
                                "openvino": lambda: {"bf16": 1.15, "int8": 1.15}})
    assert plan(paying)[:2] == ["bf16@openvino", "int8-static@openvino"], "both pay: each, its first paying runtime"
    assert "bf16@eager" in plan(paying) and "bf16@openvino" in plan(paying)
    avx2 = cpu_probe(engines={
        "torch": lambda: {"bf16": 0.05, "int8": 1.0}, "onnxruntime": lambda: {"int8": 0.9},
        "openvino": lambda: {"bf16": 0.0, "int8": 1.15}})
    names = plan(avx2)
    assert "bf16@eager" not in names and "bf16@openvino" not in names, "bf16 does not pay there: no such trial"
    assert "bf16@onnxruntime" in names, "not measured under that engine: not judged (the rules judge it)"
    assert names[0] == "int8-static@openvino", "int8 pays under OpenVINO only: still first"
    no_int8 = cpu_probe(engines={"torch": lambda: {"bf16": 2.0, "int8": 0.9}, "onnxruntime": lambda: {"int8": 0.8},
                                 "openvino": lambda: {"bf16": 1.15, "int8": 0.0}})
    assert plan(no_int8)[-2:] == ["int8-static@openvino", "int8-static@onnxruntime"], "int8 that pays nowhere: last"
    assert "torch bf16 2.00x" in no_int8.describe()


def test_a_probe_that_did_not_decide_orders_but_drops_nothing() -> None:
    """bf16's rounds straddle the threshold: its median (0.9x) puts it last, but no trial is dropped for it."""
    undecided = probe_machine(torch.device("cpu"), {"torch": lambda: {"bf16": Gain(0.9, 0.6, 1.8, 7)}},
                              RUNTIME_ENGINES)
    assert undecided.pays("eager", "bf16") is None and undecided.likely_pays("eager", "bf16") is False
    assert probe_reason(undecided, ({"stage": "amp", "dtype": "bfloat16"},), "eager") is None
    assert "bf16@eager" in plan(undecided) and "not decided" in undecided.describe()
    decided = probe_machine(torch.device("cpu"), {"torch": lambda: {"bf16": Gain(0.9, 0.8, 1.0, 7)}},
                            RUNTIME_ENGINES)
    reason = probe_reason(decided, ({"stage": "amp", "dtype": "bfloat16"},), "eager")
    assert reason is not None and "at most 1.00x" in reason and "bf16@eager" not in plan(decided)
    legacy = MachineProbe(gains={"torch": {"bf16": 0.0}})  # stored before probes kept their rounds' range
    assert probe_reason(legacy, ({"stage": "amp", "dtype": "bfloat16"},), "eager") is None, "orders only"


def test_the_probe_warms_each_precision_so_a_slow_first_call_decides_nothing() -> None:
    """A GPU's first bfloat16 product (library handles, kernel selection) is far slower than a warm float32
    one: the old probe read 0.00x from it. Injected: 1,000 ms for the first call, then 1 ms against 4 ms, on a
    simulated clock (the CPU's one clock, swapped)."""
    calls = {"fp32": 0, "bf16": 0}
    clock = SimulatedClock()

    def product(name: str, warm_ms: float, first_ms: float) -> Callable[[], None]:
        def call() -> None:
            calls[name] += 1
            clock.advance(first_ms if calls[name] == 1 else warm_ms)
        return call

    with use_clock(torch.device("cpu"), clock):
        gain = paired_gain(product("fp32", 4.0, 4.0), product("bf16", 1.0, 1000.0), torch.device("cpu"))
    assert gain.ratio == pytest.approx(4.0) and gain.decided() is True and gain.rounds >= MIN_ROUNDS
    assert calls["bf16"] > MIN_ROUNDS, "timed in rounds after its warm-up, never once"


class CountingRuntime(Runtime):
    """A plugin's runtime with an engine of its own, whose probe counts its runs."""

    name: ClassVar[str] = "counting_test"
    engine: ClassVar[str] = "counting"
    runs: ClassVar[int] = 0

    def available(self, device: torch.device) -> bool:
        return True

    def probe(self, device: torch.device) -> Callable[[], dict[str, float]]:
        def measure() -> dict[str, float]:
            CountingRuntime.runs += 1
            return {"int8": 3.0}
        return measure

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        return model


def test_a_plugin_engine_is_probed_through_its_declaration_once_per_process() -> None:
    with registered_runtime(CountingRuntime()):
        first = probe_machine(torch.device("cpu"), *declared_probes(["counting_test"], torch.device("cpu")))
        again = probe_machine(torch.device("cpu"), *declared_probes(["counting_test"], torch.device("cpu")))
    assert first.gain("counting_test", "int8") == 3.0 and first.engine("counting_test") == "counting"
    assert again.gains == first.gains and CountingRuntime.runs == 1, "the hardware is probed once per process"


def test_the_probe_names_each_runtime_engine_from_its_declaration() -> None:
    """The engines come from the runtimes' declarations (``Runtime.engine``), not from their names."""
    probes, engines = declared_probes(["eager", "compile", "onnxruntime", "openvino"], torch.device("cpu"))
    assert engines == RUNTIME_ENGINES and set(probes) == {"torch", "onnxruntime", "openvino"}


def test_stage_precision_reads_the_lowest_precision() -> None:
    assert stage_precision(({"stage": "amp", "dtype": "bfloat16"},)) == "bf16"
    assert stage_precision(({"stage": "prune"}, {"stage": "quantize", "method": "int8_dynamic"})) == "int8"
    assert stage_precision(({"stage": "quantize", "method": "int4_weight_only"},)) == "other"
    assert stage_precision(()) == "fp32"


class FakeTrial:
    def __init__(self, number: int, seconds: float, speedup: float, feasible: bool = True) -> None:
        start = datetime(2026, 11, 28, 12, 0, 0)
        self.number = number
        self.state = optuna.trial.TrialState.COMPLETE
        self.datetime_start = start + timedelta(seconds=seconds - 1)
        self.datetime_complete = start + timedelta(seconds=seconds)
        self.user_attrs = {ATTR_FEASIBLE: feasible, ATTR_METRICS: {"speedup": speedup}}


def test_time_to_result_keeps_the_rises_of_feasible_trials() -> None:
    trials = [FakeTrial(0, 1, 1.0), FakeTrial(1, 5, 3.0), FakeTrial(2, 9, 9.0, feasible=False),
              FakeTrial(3, 12, 2.5), FakeTrial(4, 20, 4.0)]
    points = best_so_far(trials)  # type: ignore[arg-type]
    assert time_to_result(points) == [[1.0, 1.0], [5.0, 3.0], [20.0, 4.0]]
    assert time_to_reach(points, 3.0) == 5.0 and time_to_reach(points, 5.0) is None
    # the console's line (found_line) names the front's lead: tests/pipeline/search/test_best_everywhere.py
