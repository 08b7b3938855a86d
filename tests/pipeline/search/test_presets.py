"""Precision presets under every runtime, before any costly stage (pipeline/search/presets.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from optuna.trial import TrialState
from torch import Tensor, nn

from paretorch.pipeline.core.machine_probe import stage_precision
from paretorch.pipeline.core.runtimes.base import ExportHandle, Runtime
from paretorch.pipeline.core.runtimes.registry import registered_runtime
from paretorch.pipeline.core.runtimes.reproduces import Reproduces
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import config_from_dict
from paretorch.pipeline.search import Preset, Search, SearchConfig, run_search
from paretorch.pipeline.search.config import SeedRecipe
from paretorch.pipeline.search.objectives import ATTR_SEED, ATTR_SEED_RECIPE
from paretorch.pipeline.search.presets import (
    ATTR_LATER_SEEDS,
    ATTR_SKIPPED_PRESETS,
    PRESET_PREFIX,
    is_preset,
    preset_name,
    preset_rank,
    preset_seeds,
)

BF16 = Preset(name="bf16", stages=({"stage": "amp", "dtype": "bfloat16", "fp32_layers": []},))
INT8 = Preset(name="int8-dynamic", stages=({"stage": "quantize", "method": "int8_dynamic"},))
FP32 = Preset(name="fp32")


class NoAmpRuntime(Runtime):
    """A runtime registered by a test: runs the torch module, but not a recipe with AMP."""

    name: ClassVar[str] = "no_amp_test"

    def available(self, device: torch.device) -> bool:
        return True

    #: Any quantization, float32 only: what it reproduces is declared, the registry's check refuses AMP.
    reproduces = Reproduces(precisions=frozenset({"float32"}))

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        return model


def test_presets_are_preset_major_and_skip_what_cannot_run() -> None:
    def skip(stages: tuple[dict[str, Any], ...], runtime: str) -> str | None:
        return "no amp here" if runtime == "openvino" and any(s["stage"] == "amp" for s in stages) else None

    plan = preset_seeds([BF16, INT8, FP32], ["eager", "compile", "openvino"], skip)
    assert [s.name for s in plan.seeds] == [preset_name(p, r) for p, r in (
        ("bf16", "compile"), ("bf16", "eager"), ("int8-dynamic", "compile"), ("int8-dynamic", "openvino"),
        ("int8-dynamic", "eager"), ("fp32", "compile"), ("fp32", "openvino"), ("fp32", "eager"))], (
        "preset-major, eager (the reference) last in each")
    assert plan.skipped == {"preset-bf16@openvino": "no amp here"}
    assert [s.runtime for s in plan.seeds[:3]] == ["compile", "eager", "compile"]
    assert plan.seeds[0].stages == BF16.stages
    assert plan.describe(plan.seeds[2:4]) == (
        "presets first (2 trial(s), each alone, before costly stages): int8-dynamic@compile, "
        "int8-dynamic@openvino; "
        "1 pair(s) skipped as they cannot run here: no amp here (1)")


def test_the_presets_line_names_each_skip_reason_once_with_its_count() -> None:
    """A stage that cannot apply to this model (pack on a non-BERT encoder) says why once, at the start."""
    def skip(stages: tuple[dict[str, Any], ...], runtime: str) -> str | None:
        if any(s["stage"] == "amp" for s in stages):
            return "pack: embeddings are not BERT's (MPNetEmbeddings)"
        return "no such runtime here" if runtime == "openvino" else None

    plan = preset_seeds([BF16, INT8, FP32], ["eager", "compile", "openvino"], skip)
    line = plan.describe(plan.seeds) or ""
    assert line.endswith("5 pair(s) skipped as they cannot run here: pack: embeddings are not BERT's "
                         "(MPNetEmbeddings) (3); no such runtime here (2)"), line
    assert line.count("MPNetEmbeddings") == 1


def test_a_preset_runs_under_its_own_runtimes_in_its_order() -> None:
    """A preset naming its runtimes gets those the study offers, in the preset's order (eager too, if named);
    an unknown runtime name in a preset is a config error."""
    int8 = Preset(name="int8-static", stages=({"stage": "quantize", "method": "int8_static_pt2e"},),
                  runtimes=("onnxruntime", "openvino", "compile"))
    plan = preset_seeds([int8, FP32], ["eager", "compile", "onnxruntime"], lambda stages, runtime: None)
    assert [s.name for s in plan.seeds] == [preset_name(p, r) for p, r in (
        ("int8-static", "onnxruntime"), ("int8-static", "compile"),
        ("fp32", "compile"), ("fp32", "onnxruntime"), ("fp32", "eager"))]
    with pytest.raises(ValueError, match="unknown runtime"):
        Preset(name="x", runtimes=("eagre",))


def test_the_shipped_presets_put_static_int8_first_and_never_under_eager() -> None:
    """On a CPU the fastest one-line peer is static int8 under OpenVINO: it runs first; PT2E int8 under eager
    (reference kernels, slower than float32) and packing without a compiler are not tried."""
    shipped = SearchConfig.load().presets
    runtimes = ["eager", "compile", "compile_dynamic", "onnxruntime", "openvino"]
    plan = preset_seeds(shipped, runtimes, lambda stages, runtime: None)
    names = [s.name for s in plan.seeds]
    assert names[0] == preset_name("int8-static", "openvino")
    assert preset_name("int8-static", "eager") not in names
    assert not any("packed@eager" in n or "packed@compile_dynamic" in n for n in names)
    assert len(names) < len(shipped) * len(runtimes)


@pytest.fixture
def with_fake_runtime() -> Iterator[str]:
    runtime = NoAmpRuntime()
    with registered_runtime(runtime):
        yield runtime.name


def test_a_registered_runtime_gets_the_presets_it_can_run_before_the_costly_seeds(
    with_fake_runtime: str, residual_spec: ModelSpec, tmp_path: Path
) -> None:
    """The shipped presets (their runtime lists left out: every runtime of the study) under eager, compile and a
    runtime registered here: the runtime that cannot run AMP gets no AMP seed; every preset trial is queued
    before the first seed with a costly stage (distillation)."""
    shipped = SearchConfig.load()
    config = SearchConfig.load(None, runtimes=("eager", "compile", with_fake_runtime), exports="none",
                               presets=[p.model_dump(exclude={"runtimes"}) for p in shipped.presets],
                               seeds=[s.model_dump() for s in shipped.seeds])
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}", track=False)
    assert search.plan.runtimes == ("eager", "compile", with_fake_runtime)
    study = search.store.open_study()
    prepared = search.ensure_baseline(study)
    presets_line = prepared.presets_line
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    later = [SeedRecipe(**raw) for raw in study.user_attrs[ATTR_LATER_SEEDS]]
    # The queue in the order it runs: what is enqueued, then what waits until the queue runs dry.
    queue = [(t.user_attrs[ATTR_SEED], t.user_attrs[ATTR_SEED_RECIPE]["stages"]) for t in waiting]
    queue += [(seed.name, list(seed.stages)) for seed in later]
    names = [name for name, _ in queue]
    assert names[0] == "baseline"
    assert "preset-int8-dynamic@no_amp_test" in names and "preset-fp32@no_amp_test" in names
    assert "preset-bf16@no_amp_test" not in names, "a runtime that cannot run AMP gets no AMP seed"
    assert names.index("preset-int8-dynamic@compile") < names.index("preset-int8-dynamic@eager"), (
        "eager last within a preset")
    skipped = study.user_attrs[ATTR_SKIPPED_PRESETS]
    if "preset-bf16@compile" in names:
        assert names.index("preset-bf16@compile") < names.index("preset-bf16@eager"), "eager last within a preset"
    else:  # a CPU that emulates bf16 (no AVX512-BF16 / AMX): the probe rules it out, and says so
        assert "the machine probe: bf16" in skipped["preset-bf16@compile"], skipped
    assert "preset-fp32@eager" not in names, "float32 under eager is the baseline"
    assert not any("fp16" in n for n in names), "float16 is slower only on a CPU"
    assert not any("packed" in n for n in names), "the residual MLP has no padding mask"
    enqueued = sum(1 for t in waiting if t.user_attrs[ATTR_SEED].startswith(PRESET_PREFIX))
    assert presets_line is not None and presets_line.startswith(f"presets first ({enqueued} trial(s)")

    def costly(stages: list[dict[str, Any]]) -> bool:
        return any(config_from_dict(dict(raw)).low_fidelity() is not None for raw in stages)

    presets = [i for i, n in enumerate(names) if n.startswith(PRESET_PREFIX)]
    first_costly = next(i for i, (_, stages) in enumerate(queue) if costly(stages))
    assert names[first_costly] == "prune-0.3-distill"
    assert presets and max(presets) < first_costly
    assert not any(costly(queue[i][1]) for i in presets), "presets are cheap"
    if later:  # int8 pays on this CPU: those presets first, then the cheap seeds, then the other presets
        first_seed = names.index("prune-0.3")
        assert all(name.startswith(PRESET_PREFIX) for name in names[1:first_seed])
        assert {seed.name for seed in later} >= {"preset-fp32@no_amp_test", "prune-0.3-distill"}
        assert f"{len([s for s in later if s.name.startswith(PRESET_PREFIX)])} more after the cheap seeds" in (
            presets_line)
    ranks = {p.name: preset_rank(p, search.plan.runtimes, prepared.machine) for p in config.presets}
    config_order = [p.name for p in shipped.presets]
    enqueued_names = [t.user_attrs[ATTR_SEED] for t in waiting]
    for wave in (enqueued_names, [seed.name for seed in later]):  # the first presets, then those that wait
        order = [n.removeprefix(PRESET_PREFIX).split("@")[0] for n in wave if n.startswith(PRESET_PREFIX)]
        assert order == sorted(order, key=lambda name: (ranks[name], config_order.index(name))), (
            "preset-major, in the config's order after the machine probe's (int8 first where it pays)")
    if later:
        first_int8 = [n for n in enqueued_names if n.startswith(PRESET_PREFIX + "int8")]
        assert len(first_int8) == len({n.split("@")[0] for n in first_int8}), "each int8 preset once, first"


def test_the_waiting_seeds_run_once_the_queue_runs_dry(residual_spec: ModelSpec, tmp_path: Path) -> None:
    """Where a reduced precision pays, the presets that do not lead and the costly seeds wait in the study
    (``ATTR_LATER_SEEDS``); the search enqueues them when nothing else waits, after the first presets and the cheap
    seeds have run."""
    shipped = SearchConfig.load()
    config = SearchConfig.load(None, runtimes=("eager",), exports="none", latency_budget="quick", compose=0,
                               presets=[p.model_dump(exclude={"runtimes"}) for p in shipped.presets],
                               seeds=[{"name": "prune-0.3", "stages": [{"stage": "prune", "ratio": 0.3}]},
                                      {"name": "prune-0.3-distill", "stages": [
                                          {"stage": "prune", "ratio": 0.3}, {"stage": "distill", "max_seconds": 3}]}])
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}", track=False)
    study = search.store.open_study()
    probe = search.ensure_baseline(study).machine
    later = [raw["name"] for raw in study.user_attrs[ATTR_LATER_SEEDS]]
    if not later:
        pytest.skip("no reduced precision pays under torch on this CPU: nothing waits (the order is the config's)")
    assert "prune-0.3-distill" in later, "the costly seed waits"
    assert probe is not None
    for name in later:  # a waiting preset is one whose precision does not pay here (under eager, the only runtime)
        if is_preset(name):
            raw = next(r for r in study.user_attrs[ATTR_LATER_SEEDS] if r["name"] == name)
            assert not probe.likely_pays("eager", stage_precision(tuple(raw["stages"]))), name
    now = [t.user_attrs[ATTR_SEED] for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    outcome = run_search(search, trials=len(now) + len(later))
    ran = [t.user_attrs[ATTR_SEED] for t in sorted(outcome.study.trials, key=lambda t: t.number)]
    first_later = min(ran.index(name) for name in later if name in ran)
    assert ran.index("prune-0.3") < first_later, "the cheap seed before the waiting presets"
    assert ran[:first_later] == now, "the waiting seeds enqueued when the queue ran dry, after the first ones"
