"""The runner and its cache, with small test-only stages on the residual MLP spec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
import torch
from pydantic import Field
from torch import nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.evaluate import LatencySettings
from paretorch.pipeline.core.mirror import NotMirrored
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import ExportResult, Stage, StageConfig, StageContext, registered
from paretorch.pipeline.engine.cache import CacheWriteError, NodeCache, model_digest
from paretorch.pipeline.engine.graph import EVALUATE_OP, Node, Pipeline, recipe_pipeline
from paretorch.pipeline.engine.recipe import Recipe, describe_config, flatten_node_configs
from paretorch.pipeline.engine.runner import Runner

FAST = LatencySettings(warmup_runs=1, min_runs=3, min_seconds=0)
CALLS: Counter[str] = Counter()
SEEN: dict[str, object] = {}


class ScaleConfig(StageConfig):
    stage = "toy.scale"
    factor: float = Field(gt=0)


class RoundConfig(StageConfig):
    """Numeric: rounds weights to ``decimals`` (None: chosen by the stage, then resolved)."""

    stage = "toy.round"
    decimals: int | None = Field(default=None, ge=0)


class SaveConfig(StageConfig):
    stage = "toy.export"
    note: str = "saved"


class TroubleConfig(StageConfig):
    stage = "toy.trouble"
    mode: Literal["infeasible", "error"] = "infeasible"


def apply_scale(model: nn.Module, config: ScaleConfig, ctx: StageContext) -> nn.Module:
    CALLS["toy.scale"] += 1
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(config.factor)
    ctx.record("toy.scale.params", sum(p.numel() for p in model.parameters()))
    return model


def apply_round(model: nn.Module, config: RoundConfig, ctx: StageContext) -> nn.Module:
    CALLS["toy.round"] += 1
    decimals = 3 if config.decimals is None else config.decimals
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.round(param, decimals=decimals))
    ctx.resolve(RoundConfig(decimals=decimals))
    return model


def apply_save(model: nn.Module, config: SaveConfig, ctx: StageContext) -> ExportResult:
    CALLS["toy.export"] += 1
    SEEN["upstream"] = ctx.upstream
    SEEN["float_model"] = ctx.float_model
    path = ctx.require_output_dir() / "model.pt"
    torch.save(ctx.float_model.state_dict(), path)
    if config.note == "interrupt":  # Ctrl-C after the file is half done
        raise KeyboardInterrupt
    return ExportResult(format="torch", path=path, size_bytes=path.stat().st_size, validation="saved",
                        metrics={"tensors": float(len(model.state_dict()))})


def apply_trouble(model: nn.Module, config: TroubleConfig, ctx: StageContext) -> nn.Module:
    CALLS["toy.trouble"] += 1
    if config.mode == "infeasible":
        raise InfeasibleConfig("no kernel for this toy")
    raise RuntimeError("toy stage bug")


TOY_STAGES = (
    Stage(ScaleConfig, apply_scale),
    Stage(RoundConfig, apply_round, numeric=True, mirror=NotMirrored("a toy")),
    Stage(SaveConfig, apply_save, produces="export"),
    Stage(TroubleConfig, apply_trouble),
)


@pytest.fixture(scope="module", autouse=True)
def toy_stages() -> Iterator[None]:
    """Register the toy stages for this module only (never seen by other tests)."""
    with registered(*TOY_STAGES):
        yield


def toy_pipeline() -> Pipeline:
    return Pipeline([
        Node("model", "model"),
        Node("scale", "toy.scale", ("model",)),
        Node("trouble", "toy.trouble", ("scale",)),
        Node("round", "toy.round", ("trouble",)),
        Node("evaluate", EVALUATE_OP, ("round",)),
        Node("export", "toy.export", ("round",)),
        Node("evaluate.export", EVALUATE_OP, ("export",)),
    ], name="toy")


@pytest.fixture()
def runner(residual_spec: ModelSpec, tmp_path: Path) -> Runner:
    cache = NodeCache(export_dir=tmp_path / "exports")
    return Runner(toy_pipeline(), residual_spec, torch.device("cpu"), cache=cache, latency=FAST,
                  work_dir=tmp_path / "work")


def test_shared_prefix_is_reused(runner: Runner) -> None:
    CALLS.clear()
    first = runner.run({"scale": ScaleConfig(factor=0.5), "round": RoundConfig()}, exports=False)
    second = runner.run({"scale": ScaleConfig(factor=0.5), "round": RoundConfig(decimals=1)}, exports=False)
    assert CALLS["toy.scale"] == 1, "the second run reuses the scaled model"
    assert second.nodes["scale"].cached and not second.nodes["round"].cached
    assert first.nodes["scale"].key == second.nodes["scale"].key
    assert second.cache_hits == 1 and second.cache_misses == 2  # round + evaluation
    assert runner.cache.stats.hits["model"] == 1


def test_off_stage_passes_its_input_through(runner: Runner) -> None:
    result = runner.run({"scale": ScaleConfig(factor=2.0)}, exports=False)
    assert not result.nodes["trouble"].ran and not result.nodes["round"].ran
    assert result.nodes["round"].key == result.nodes["scale"].key
    assert result.recipe("residual_mlp").stages == (ScaleConfig(factor=2.0),)
    baseline = runner.run({}, exports=False)
    assert baseline.nodes["round"].key == runner.source_key
    assert baseline.recipe(None).describe() == "baseline | eager"


def test_input_model_is_never_changed(runner: Runner) -> None:
    before = model_digest(runner.model)
    runner.run({"scale": ScaleConfig(factor=3.0), "round": RoundConfig(decimals=0)}, exports=False)
    assert model_digest(runner.model) == before


def test_infeasible_is_reported_with_its_node_and_never_cached(runner: Runner) -> None:
    CALLS.clear()
    configs = {"trouble": TroubleConfig(mode="infeasible")}
    for _ in range(2):
        with pytest.raises(InfeasibleConfig, match="trouble: no kernel for this toy"):
            runner.run(configs, exports=False)
    assert CALLS["toy.trouble"] == 2


def test_stage_errors_propagate_with_the_node_named(runner: Runner) -> None:
    with pytest.raises(RuntimeError, match="toy stage bug") as info:
        runner.run({"trouble": TroubleConfig(mode="error")}, exports=False)
    assert any("pipeline node 'trouble'" in note for note in info.value.__notes__)


def test_export_gets_float_model_and_upstream_and_is_cached_on_disk(runner: Runner) -> None:
    CALLS.clear()
    configs = {"scale": ScaleConfig(factor=0.5), "round": RoundConfig(), "export": SaveConfig()}
    result = runner.run(configs)
    assert SEEN["upstream"] == (ScaleConfig(factor=0.5), RoundConfig(decimals=3)), "resolved configs, in order"
    # The exporter sees the model after the last non-numeric stage (scale), not the rounded one.
    assert model_digest(SEEN["float_model"]) == model_digest(result.nodes["scale"].value)  # type: ignore[arg-type]
    export = result.exports["export"]
    assert export.path.is_file() and export.path.is_relative_to(runner.cache.export_dir)
    assert result.export_evaluations["evaluate.export"]["tensors"] > 0
    recipe = result.recipe("residual_mlp")
    assert [c.stage for c in recipe.stages] == ["toy.scale", "toy.round", "toy.export"]
    assert recipe.stages[1] == RoundConfig(decimals=3)
    again = runner.run(configs)
    assert CALLS["toy.export"] == 1 and again.nodes["export"].cached
    assert again.exports["export"].path == export.path
    assert again.nodes["export"].resolved == SaveConfig()


def test_exports_can_be_skipped_or_run_without_evaluation(runner: Runner) -> None:
    configs = {"export": SaveConfig()}
    skipped = runner.run(configs, exports=False)
    assert "export" not in skipped.nodes and "evaluate" in skipped.nodes
    only = runner.run(configs, evaluate=False)
    assert "evaluate" not in only.nodes and "export" in only.nodes


def test_failed_cache_write_is_an_error(residual_spec: ModelSpec, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the export cache should be")
    runner = Runner(toy_pipeline(), residual_spec, torch.device("cpu"),
                    cache=NodeCache(export_dir=blocker), latency=FAST, work_dir=tmp_path / "work")
    with pytest.raises(CacheWriteError, match="cannot create the export staging directory"):
        runner.run({"export": SaveConfig()})


def test_an_interrupted_export_leaves_no_staging_folder(runner: Runner) -> None:
    with pytest.raises(KeyboardInterrupt):
        runner.run({"export": SaveConfig(note="interrupt")})
    assert runner.cache.export_dir is not None
    assert list(runner.cache.export_dir.iterdir()) == [], "nothing half-written stays in the export cache"


def test_a_killed_process_staging_folder_goes_when_the_cache_opens_again(tmp_path: Path) -> None:
    """kill -9 runs no cleanup: the next process that opens the cache removes the folders of dead processes,
    not those of live ones (another worker exporting now)."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True, timeout=60)
    exports = tmp_path / "exports"
    killed = exports / f".abc.staging-{int(dead.stdout)}"
    alive = exports / f".def.staging-{os.getpid()}"
    committed = exports / "abc"
    for folder in (killed, alive, committed):
        (folder / "part").mkdir(parents=True)
    cache = NodeCache(export_dir=exports)
    assert cache.removed_staging == [killed]
    assert not killed.exists() and alive.exists() and committed.exists()


def test_memory_bound_evicts_least_recently_used(residual_spec: ModelSpec, tmp_path: Path) -> None:
    model_bytes = sum(t.numel() * t.element_size() for t in residual_spec.build().state_dict().values())
    cache = NodeCache(memory_bytes=int(model_bytes * 1.5), export_dir=tmp_path / "exports")
    runner = Runner(toy_pipeline(), residual_spec, torch.device("cpu"), cache=cache, latency=FAST)
    CALLS.clear()
    runner.run({"scale": ScaleConfig(factor=0.5)}, exports=False)
    runner.run({"scale": ScaleConfig(factor=0.25)}, exports=False)
    runner.run({"scale": ScaleConfig(factor=0.5)}, exports=False)
    assert cache.stats.evictions >= 1
    assert CALLS["toy.scale"] == 3, "the first model was evicted and recomputed"
    assert cache.memory_used <= cache.memory_bytes


def test_evaluation_is_cached_per_runtime(runner: Runner) -> None:
    first = runner.run({"scale": ScaleConfig(factor=0.9)}, exports=False)
    second = runner.run({"scale": ScaleConfig(factor=0.9)}, exports=False)
    assert second.nodes["evaluate"].cached and second.report is first.report
    assert first.report.metric_value == pytest.approx(second.report.metric_value)
    assert first.seconds["evaluation"] > 0


def test_unknown_node_in_configs_is_rejected(runner: Runner) -> None:
    with pytest.raises(Exception, match="no stage node named quantize"):
        runner.run({"quantize": ScaleConfig(factor=1.0)})


def test_recipe_round_trip_and_replay(runner: Runner, residual_spec: ModelSpec, tmp_path: Path) -> None:
    result = runner.run({"scale": ScaleConfig(factor=0.5), "round": RoundConfig(), "export": SaveConfig()})
    recipe = result.recipe("residual_mlp", metadata={"trial": 3})
    path = recipe.save(tmp_path / "recipe.json")
    loaded = Recipe.load(path)
    assert loaded == recipe and loaded.metadata == {"trial": 3}
    assert json.loads(path.read_text())["stages"][1] == {"stage": "toy.round", "decimals": 3}
    assert loaded.describe() == "toy.scale(factor=0.5) + toy.round(decimals=3) | eager | -> toy.export"
    replay = Runner(recipe_pipeline(loaded.stages), residual_spec, torch.device("cpu"), cache=runner.cache,
                    latency=FAST).run({}, loaded.runtime)
    assert replay.report.metric_value == result.report.metric_value


def test_flat_params_and_descriptions() -> None:
    params = flatten_node_configs({"scale": ScaleConfig(factor=0.5), "round": None}, "compile")
    assert params == {"runtime": "compile", "scale.factor": "0.5", "round": "off"}
    assert describe_config(RoundConfig()) == "toy.round()"
    assert describe_config(SaveConfig(note="x")) == "toy.export(note=x)"
