"""The Optuna search: config, study naming, seeds, infeasible and failing trials, cache reuse, resume."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import torch
from torch import nn

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, config_from_dict, registered
from paretorch.pipeline.engine.graph import default_pipeline
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.search import Search, SearchConfig, SeedRecipe, run_search, study_name
from paretorch.pipeline.search.allowed_drop import DEFAULT_MAX_DROP, AllowedDrop
from paretorch.pipeline.search.loop import spent
from paretorch.pipeline.search.objectives import (
    ATTR_CACHE,
    ATTR_FEASIBLE,
    ATTR_INFEASIBLE,
    ATTR_METRICS,
    ATTR_REASON,
    ATTR_RECIPE,
    ATTR_REPEAT_OF,
    ATTR_SEED,
    ATTR_TRACEBACK,
    CONSTRAINT_NAME,
)
from paretorch.pipeline.search.time_to_result import STUDY_START

UNSTRUCTURED = {"stage": "prune", "method": "unstructured", "ratio": 0.3}


class BoomConfig(StageConfig):
    """A test-only stage that always raises a bug (not an infeasibility); never suggested."""

    stage = "toy.boom"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> BoomConfig | None:
        return None


def apply_boom(model: nn.Module, config: BoomConfig, ctx: StageContext) -> nn.Module:
    raise RuntimeError("toy.boom exploded")


@pytest.fixture(scope="module")
def boom_stage() -> Iterator[None]:
    with registered(Stage(BoomConfig, apply_boom)):
        yield


def test_search_config_validation_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--max-drop -0.5: a drop cannot be negative"):
        SearchConfig.load(None, max_drop=-0.5)
    bad = tmp_path / "search.yaml"
    bad.write_text("sampler: grid\n")
    with pytest.raises(ConfigError, match=r"sampler='grid'"):
        SearchConfig.load(bad)
    with pytest.raises(ConfigError, match="search config not found"):
        SearchConfig.load(tmp_path / "missing.yaml")
    shipped = SearchConfig.load()
    assert shipped.objectives == ("metric", "latency") and shipped.max_drop.to_json() == "1%"
    # the shipped file and the model's own default agree: a config file without max_drop gets the same drop
    no_drop = tmp_path / "no-drop.yaml"
    no_drop.write_text("sampler: tpe\n")
    assert SearchConfig.load(no_drop).max_drop == shipped.max_drop == DEFAULT_MAX_DROP == AllowedDrop("relative", 0.01)
    own = tmp_path / "own-drop.yaml"
    own.write_text("max_drop: 0.01\n")
    assert SearchConfig.load(own).max_drop == AllowedDrop("absolute", 0.01)  # a config's own drop stays
    assert SearchConfig.load(own, max_drop="2%").max_drop == AllowedDrop("relative", 0.02)  # the flag wins
    assert [s.name for s in shipped.seeds] == ["prune-depth", "prune-0.3", "prune-0.3-distill"]
    assert [p.name for p in shipped.presets] == ["int8-static", "bf16", "fp16", "bf16-packed", "fp16-packed",
                                                 "int8-dynamic", "int8-dynamic-packed", "fp32", "fp32-packed"]
    assert shipped.costly_share == 0.25


def test_study_name_follows_what_trials_mean(residual_spec: ModelSpec) -> None:
    cpu = torch.device("cpu")
    pipeline = default_pipeline()
    base = SearchConfig.load()
    name = study_name(residual_spec, cpu, base, pipeline)
    assert name.startswith("residual_mlp-cpu-")
    assert study_name(residual_spec, cpu, SearchConfig.load(None, exports="none", cache_mb=16), pipeline) == name
    assert study_name(residual_spec, cpu, SearchConfig.load(None, max_drop=0.02), pipeline) != name
    # a seed field added later renames only the studies whose seeds set it
    seed = {"name": "int8", "stages": [{"stage": "quantize", "method": "int8_dynamic"}]}
    plain = SearchConfig.load(None, seeds=[seed])
    assert "skip_where_unavailable" not in plain.identity()["seeds"][0]
    assert SearchConfig.load(None, seeds=[{**seed, "skip_where_unavailable": True}]).identity() != plain.identity()


def test_unknown_disabled_stage_is_rejected(residual_spec: ModelSpec) -> None:
    with pytest.raises(ConfigError, match=r"cannot disable \['sparsify'\]"):
        Search(residual_spec, torch.device("cpu"), SearchConfig.load(None, disabled=("sparsify",)), track=False)


@pytest.fixture(scope="module")
def searched(residual_spec: ModelSpec, boom_stage: None, tmp_path_factory: pytest.TempPathFactory) -> Search:
    """Six trials on the residual MLP: the baseline, seeds (a shared prune prefix, an infeasible
    config, a failing stage) and one sampled trial."""
    folder = tmp_path_factory.mktemp("search")
    pipeline_file = folder / "with-boom.yaml"
    pipeline_file.write_text(
        "nodes:\n  - {op: model}\n  - {op: prune}\n  - {op: quantize}\n  - {op: toy.boom}\n"
        "  - {name: evaluate, op: evaluate}\n"
    )
    config = SearchConfig.load(
        None, pipeline=str(pipeline_file), sampler="random", runtimes=("eager",), latency_budget="quick",
        exports="none", max_drop=0.01, seeds=[
            {"name": "prune-0.3", "stages": [UNSTRUCTURED]},
            {"name": "prune-0.3-int8", "stages": [UNSTRUCTURED, {"stage": "quantize", "method": "int8_dynamic"}]},
            {"name": "int4-on-cpu", "stages": [{"stage": "quantize", "method": "int4_weight_only"}]},
            {"name": "boom", "stages": [{"stage": "toy.boom"}]},
            {"name": "amp-not-in-this-pipeline", "stages": [{"stage": "amp"}]},
        ],
    )
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{folder / 'optuna.db'}",
                    track=False)
    search.outcome = run_search(search, trials=6)  # type: ignore[attr-defined]
    # The six trials as this run left them: tests that resume or enqueue on the same storage run in any order
    # (a shuffled run read a seventh trial here through the study's live view).
    search.trials = tuple(search.outcome.study.trials)  # type: ignore[attr-defined]
    return search


def test_baseline_first_then_seeds(searched: Search) -> None:
    trials = searched.trials  # type: ignore[attr-defined]
    assert len(trials) == 6
    assert [t.user_attrs.get(ATTR_SEED) for t in trials[:5]] == ["baseline", "prune-0.3", "prune-0.3-int8",
                                                                 "int4-on-cpu", "boom"]
    baseline = trials[0]
    assert baseline.state.name == "COMPLETE"
    assert baseline.values[0] == pytest.approx(searched.outcome.baseline.metric_value)  # type: ignore[attr-defined]
    assert baseline.constraints[CONSTRAINT_NAME] == -0.01
    assert baseline.system_attrs["constraints"] == [-0.01], "the list optuna-dashboard 0.21 reads"
    assert Recipe.from_dict(baseline.user_attrs[ATTR_RECIPE]).stages == ()


def test_shared_prune_prefix_hits_the_cache(searched: Search) -> None:
    trials = searched.trials  # type: ignore[attr-defined]
    # complete, or stopped by the latency probe after its stages ran (int8 under eager on this tiny model)
    assert trials[2].state.name in ("COMPLETE", "PRUNED")
    assert trials[2].user_attrs[ATTR_CACHE]["hits"] >= 1, "the pruned model of trial 1 is reused"
    assert searched.model.runner.cache.stats.hits["model"] >= 1


def test_infeasible_config_is_a_pruned_trial_with_its_reason(searched: Search) -> None:
    trial = searched.trials[3]  # type: ignore[attr-defined]
    assert trial.state.name == "PRUNED"
    assert trial.user_attrs[ATTR_INFEASIBLE].startswith("quantize: int4_weight_only cannot run on cpu")


def test_failing_trial_records_its_traceback_and_the_study_goes_on(searched: Search) -> None:
    trials = searched.trials  # type: ignore[attr-defined]
    assert trials[4].state.name == "FAIL"
    assert "RuntimeError: toy.boom exploded" in trials[4].user_attrs[ATTR_TRACEBACK]
    assert trials[5].state.name in ("COMPLETE", "PRUNED")


def test_trial_values_match_their_metrics_and_the_front_is_feasible(searched: Search) -> None:
    outcome = searched.outcome  # type: ignore[attr-defined]
    for trial in outcome.study.trials:
        if trial.state.name == "COMPLETE":
            metrics = trial.user_attrs[ATTR_METRICS]
            assert trial.values == [metrics["accuracy"], metrics["latency_ms_b1_via_speedup"]]
            assert metrics["metric_drop"] == pytest.approx(outcome.baseline.metric_value - metrics["accuracy"])
    assert outcome.pareto, "the baseline alone is feasible"
    assert all(t.constraints[CONSTRAINT_NAME] <= 0 for t in outcome.pareto)
    assert outcome.times.wall > outcome.times.work > 0
    assert set(outcome.recipes) == {t.number for t in outcome.pareto}
    assert all(path.is_file() for path in outcome.recipes.values())


def test_seeded_trials_carry_the_params_suggest_would_give(searched: Search) -> None:
    trials = searched.trials  # type: ignore[attr-defined]
    assert trials[0].params == {"prune.enabled": False, "quantize.method": "none"}
    assert trials[1].params["prune.method"] == "unstructured" and trials[1].params["prune.ratio"] == 0.3
    assert trials[2].params["quantize.method"] == "int8_dynamic"


def test_every_trial_says_whether_it_is_feasible_and_why_not(searched: Search) -> None:
    trials = searched.trials  # type: ignore[attr-defined]
    assert trials[0].user_attrs[ATTR_FEASIBLE] is True and ATTR_REASON not in trials[0].user_attrs
    assert trials[3].user_attrs[ATTR_FEASIBLE] is False
    assert trials[3].user_attrs[ATTR_REASON].startswith("infeasible: quantize: int4_weight_only cannot run on cpu")
    assert trials[4].user_attrs[ATTR_REASON] == "failed: RuntimeError: toy.boom exploded"
    for trial in trials:
        if trial.state.name == "COMPLETE" and not trial.user_attrs[ATTR_FEASIBLE]:
            assert trial.user_attrs[ATTR_REASON].startswith("over the allowed drop: drop ")


def test_rerun_resumes_the_same_study(searched: Search, residual_spec: ModelSpec) -> None:
    again = Search(residual_spec, torch.device("cpu"), searched.plan.config, storage=searched.store.url, track=False)
    assert again.store.study_name == searched.store.study_name
    outcome = run_search(again, trials=7)
    trials = outcome.study.trials
    assert len([t for t in trials if ATTR_REPEAT_OF not in t.user_attrs]) == 7, "repeats are not counted"
    assert [t.user_attrs.get(ATTR_SEED) for t in trials].count("baseline") == 1, "seeds are not enqueued twice"
    assert outcome.baseline == searched.outcome.baseline  # type: ignore[attr-defined]


def test_enqueued_recipe_runs_once(searched: Search, residual_spec: ModelSpec) -> None:
    again = Search(residual_spec, torch.device("cpu"), searched.plan.config, storage=searched.store.url, track=False)
    seed = SeedRecipe(name="mine", stages=({"stage": "prune", "ratio": 0.5},))
    study = again.store.open_study()
    seeder = again.seeder()
    assert seeder.enqueue(study, seed) is True
    assert seeder.enqueue(study, seed) is False
    assert seeder.enqueue(study, SeedRecipe(name="no-amp-here", stages=({"stage": "amp"},))) is False


def test_the_fastest_feasible_recipe_is_tried_under_the_other_runtimes(
    residual_spec: ModelSpec, tmp_path: Path
) -> None:
    config = SearchConfig.load(None, pipeline="default", sampler="random", runtimes=("eager", "compile"),
                               latency_budget="quick", exports="none", disabled=("amp",), seeds=[])
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'optuna.db'}",
                    track=False)
    trials = run_search(search, trials=3).study.trials
    # The baseline (eager) is the first fastest feasible trial: its recipe runs next under compile.
    assert trials[1].user_attrs[ATTR_SEED] == "runtime-sweep-of-trial-0"
    first_sweep = Recipe.from_dict(trials[1].user_attrs[ATTR_RECIPE])
    assert (first_sweep.runtime, first_sweep.model_stages()) == ("compile", ())
    assert trials[1].params == {"prune.enabled": False, "distill.enabled": False, "quantize.method": "none",
                                "runtime": "compile"}
    # No (model stages, runtime) pair runs twice through a sweep, whichever trial leads afterwards.
    recipes = [Recipe.from_dict(t.user_attrs[ATTR_RECIPE]) for t in trials if ATTR_RECIPE in t.user_attrs]
    pairs = [(str(r.model_stages()), r.runtime) for r in recipes]
    swept = [(str(r.model_stages()), r.runtime) for t, r in
             ((t, Recipe.from_dict(t.user_attrs[ATTR_RECIPE])) for t in trials if ATTR_RECIPE in t.user_attrs)
             if t.user_attrs.get(ATTR_SEED, "").startswith("runtime-sweep")]
    assert swept and all(pairs.count(pair) == 1 for pair in swept)


def test_a_repeated_recipe_is_answered_by_its_first_trial_and_not_counted(
    residual_spec: ModelSpec, tmp_path: Path, stages_except: Callable[..., tuple[str, ...]]
) -> None:
    config = SearchConfig.load(None, pipeline="default", sampler="random", runtimes=("eager",),
                               latency_budget="quick", exports="none", seeds=[],
                               disabled=stages_except("prune", "distill", "quantize"))
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'optuna.db'}",
                    track=False)
    study = search.store.open_study()
    search.ensure_baseline(study)  # enqueues the baseline
    # the baseline's recipe again (every other stage, a plugin's too, is disabled above):
    study.enqueue_trial({"prune.enabled": False, "distill.enabled": False, "quantize.method": "none"})
    trials = run_search(search, trials=2).study.trials
    assert trials[1].state.name == "PRUNED" and trials[1].user_attrs[ATTR_REPEAT_OF] == 0
    assert trials[1].user_attrs[ATTR_REASON] == "repeat of trial 0" and trials[1].values is None
    distinct = [t for t in trials if ATTR_REPEAT_OF not in t.user_attrs]
    assert len(distinct) == 2 and distinct[1].number == 2, "the repeat did not use up the budget"


def test_seeds_the_capability_table_rules_out_are_not_enqueued(
    monkeypatch: pytest.MonkeyPatch, residual_spec: ModelSpec, tmp_path: Path
) -> None:
    """On a device without a fast reduced dtype, an AMP seed could only give a slower model."""
    import paretorch.pipeline.search.seeding
    from paretorch.pipeline.core.device import Capabilities

    config = SearchConfig.load(None, runtimes=("eager",), exports="none", seeds=[])
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}", track=False)
    study = optuna.create_study()
    amp_seed = SeedRecipe(name="amp-only", stages=[{"stage": "amp"}])
    slow = Capabilities(kind="cpu", reduced_dtypes=(torch.bfloat16, torch.float16), fast_dtypes=())
    monkeypatch.setattr(paretorch.pipeline.search.seeding, "capabilities", lambda device: slow)
    seeder = search.seeder()
    assert not seeder.enqueue(study, amp_seed)
    assert seeder.enqueue(study, SeedRecipe(name="int8", stages=[{"stage": "quantize", "method": "int8_dynamic"}]))
    fast = Capabilities(kind="cpu", reduced_dtypes=(torch.bfloat16,), fast_dtypes=(torch.bfloat16,))
    monkeypatch.setattr(paretorch.pipeline.search.seeding, "capabilities", lambda device: fast)
    assert seeder.enqueue(study, amp_seed)


def test_a_latency_batch_outside_the_specs_sizes_is_measured(residual_spec: ModelSpec, tmp_path: Path) -> None:
    """The GPU throughput objective (batch 256) is not among a spec's latency batch sizes; a trial is timed at
    the objective's batch alone (the spec's other sizes cost compiled runtimes compilations that decide nothing)."""
    config = SearchConfig.load(None, runtimes=("eager",), latency_batch=64, exports="none", seeds=[])
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}", track=False)
    assert search.plan.latency_batch_sizes() == (64,)
    baseline = search.ensure_baseline(search.store.open_study()).baseline
    assert baseline.latency_ms > 0


def test_a_seed_marked_skip_where_unavailable_is_skipped_where_the_device_cannot_run_it(
    residual_spec: ModelSpec, tmp_path: Path
) -> None:
    int4 = {"stage": "quantize", "method": "int4_weight_only"}  # cannot run on the CPU
    config = SearchConfig.load(None, sampler="random", runtimes=("eager",), latency_budget="quick", exports="none")
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}", track=False)
    study = search.store.open_study()
    seeder = search.seeder()
    assert seeder.enqueue(study, SeedRecipe(name="int4-optional", stages=(int4,), skip_where_unavailable=True)) is False
    assert seeder.enqueue(study, SeedRecipe(name="int4-asked-for", stages=(int4,))) is True, (
        "a seed not so marked runs and its trial says why it cannot")


def test_the_time_split_counts_the_paired_rounds_as_evaluation_without_writing_to_the_runner() -> None:
    totals = {"evaluation": 1.0, "stages": 2.0}
    parts = SimpleNamespace(runner=SimpleNamespace(totals=totals), latency=SimpleNamespace(seconds=0.5))
    times = spent(parts, wall=10.0)  # type: ignore[arg-type]
    assert times.by_category == {"evaluation": 1.5, "stages": 2.0} and times.wall == 10.0
    assert totals == {"evaluation": 1.0, "stages": 2.0}, "the runner's tallies are its own"
    started = spent(parts, wall=10.0, study_start=4.0)  # type: ignore[arg-type]
    assert started.by_category[STUDY_START] == 4.0 and started.other == pytest.approx(2.5)
    assert "study_start 4.0 s" in started.describe() and "search, tracking and I/O 2.5 s (25.0%)" in started.describe()


def test_a_seed_marked_skip_where_unavailable_is_skipped_where_the_model_facts_rule_it_out(
    digits_spec: ModelSpec, tmp_path: Path
) -> None:
    depth = {"stage": "prune", "method": "depth", "ratio": 0.1}
    config = SearchConfig.load(None, sampler="random", runtimes=("eager",), latency_budget="quick", exports="none")
    optional = SeedRecipe(name="depth-optional", stages=(depth,), skip_where_unavailable=True)
    digits = Search(digits_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'd.db'}", track=False)
    study = digits.store.open_study()
    assert digits.model.rules.reason([config_from_dict(dict(depth))]) is not None, "digits has no removable block"
    seeder = digits.seeder()
    assert seeder.enqueue(study, optional) is False
    assert seeder.enqueue(study, SeedRecipe(name="depth-asked-for", stages=(depth,))) is True, (
        "a seed not so marked is a ruled-out trial that says why")
