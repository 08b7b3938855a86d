"""Study names that survive a new stage: the default name does not hash the stage list, a resumed study
records its stages, and a study named the old way is found by the one migration rule."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import torch
from rich.console import Console
from torch import Tensor, nn

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.runtimes.base import ExportHandle, Runtime
from paretorch.pipeline.core.runtimes.registry import registered_runtime
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, registered
from paretorch.pipeline.engine.graph import default_pipeline, load_pipeline
from paretorch.pipeline.search import Search, SearchConfig, SeedRecipe, run_search, study_name
from paretorch.pipeline.search.config import LEGACY_DEFAULT_RUNTIMES, legacy_study_name
from paretorch.pipeline.search.objectives import ATTR_INFEASIBLE, ATTR_SEED, Baseline
from paretorch.pipeline.search.probe import BEHIND_FRONT
from paretorch.pipeline.search.store import ATTR_RUNTIMES, ATTR_STAGES, ATTR_STUDY_KEY, Prepared

CPU = torch.device("cpu")
FOLD = "toy.fold:toy.fold"


class FoldConfig(StageConfig):
    """A toy stage a user installs later, between prune and quantize (on in the seed, off when sampled)."""

    stage = "toy.fold"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> FoldConfig | None:
        return None


@contextmanager
def fold_installed() -> Iterator[None]:
    with registered(Stage(FoldConfig, lambda model, config, ctx: model, order=25)):
        yield


def _config() -> SearchConfig:
    return SearchConfig.load(None, sampler="random", runtimes=("eager",), latency_budget="quick", exports="none",
                             disabled=("distill", "amp"), seeds=[])


def _search(spec: ModelSpec, folder: Path) -> Search:
    return Search(spec, CPU, _config(), storage=f"sqlite:///{folder / 'optuna.db'}", track=False)


def _run(search: Search, trials: int, folder: Path) -> str:
    with (folder / "out.txt").open("w") as stream:
        run_search(search, trials, console=Console(file=stream, width=300))
    return (folder / "out.txt").read_text()


def test_adding_a_stage_keeps_the_default_study_name(residual_spec: ModelSpec) -> None:
    config = SearchConfig.load()
    name = study_name(residual_spec, CPU, config, default_pipeline())
    legacy = legacy_study_name(residual_spec, CPU, config, default_pipeline())
    with fold_installed():
        assert "toy.fold" in default_pipeline().describe(), "the toy stage joins the default pipeline"
        assert study_name(residual_spec, CPU, config, default_pipeline()) == name
        assert legacy_study_name(residual_spec, CPU, config, default_pipeline()) != legacy, "the old rule renamed it"


def test_a_pipeline_file_keeps_its_old_name(residual_spec: ModelSpec, tmp_path: Path) -> None:
    """Only the default pipeline's name changed rule: a pipeline file's nodes are what its trials mean."""
    path = tmp_path / "pipeline.yaml"
    path.write_text("nodes:\n  - {op: model}\n  - {op: prune}\n  - {name: evaluate, op: evaluate}\n")
    config = SearchConfig.load(None, pipeline=str(path))
    pipeline = load_pipeline(str(path))
    assert study_name(residual_spec, CPU, config, pipeline) == legacy_study_name(residual_spec, CPU, config, pipeline)


def test_a_resumed_study_takes_the_new_stage_into_its_search_space(residual_spec: ModelSpec, tmp_path: Path) -> None:
    first = _search(residual_spec, tmp_path)
    _run(first, 1, tmp_path)
    study = first.store.open_study(create=False)
    assert FOLD not in study.user_attrs[ATTR_STAGES] and "prune:prune" in study.user_attrs[ATTR_STAGES]
    with fold_installed():
        refused = Search(residual_spec, CPU, _config(), storage=first.store.url, track=False)
        name = first.store.study_name
        with pytest.raises(ConfigError, match=rf"^study {name} was begun with other stages or runtimes "
                                              rf"\(study {name}: {FOLD} joined its search space.*start a "
                                              r"new study with --study-name NAME, or pass --accept-plugin-change"):
            refused.store.open_study()
        again = Search(residual_spec, CPU, _config(), storage=first.store.url, track=False,
                       extra_seeds=[SeedRecipe(name="fold", stages=({"stage": "toy.fold"},))],
                       accept_plugin_change=True)
        assert again.store.study_name == first.store.study_name
        output = _run(again, 2, tmp_path)
        study = again.store.open_study(create=False)
    assert f"study {first.store.study_name}: {FOLD} joined its search space" in output
    assert FOLD in study.user_attrs[ATTR_STAGES]
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 2 and trials[0].state.name == "COMPLETE", "resumed: one more trial, the new stage's"
    assert trials[1].user_attrs[ATTR_SEED] == "fold"
    # The fold stage is the identity: it is scored, or (on a busy machine, timed as slower than the baseline with
    # confidence) stopped by the latency probe; either way it ran under the resumed study, and did not fail.
    if trials[1].state.name != "COMPLETE":
        assert trials[1].state.name == "PRUNED", trials[1].state.name
        assert trials[1].user_attrs[ATTR_INFEASIBLE].startswith(BEHIND_FRONT), trials[1].user_attrs

    # Uninstalled again: the trial that used it cannot be read back, and the run says so before any trial.
    with pytest.raises(ConfigError, match=rf"^study {first.store.study_name} has trials with stage\(s\) {FOLD}, which "
                                          r"are not installed now: install them again"):
        _search(residual_spec, tmp_path).store.open_study()


def test_a_study_named_the_old_way_resumes_under_its_name(residual_spec: ModelSpec, tmp_path: Path) -> None:
    """The migration rule: the legacy name (the stage list hashed) is found and kept, and once opened the
    study records the new key, so a stage added later still finds it."""
    search = _search(residual_spec, tmp_path)
    legacy = legacy_study_name(residual_spec, CPU, search.plan.config, search.plan.pipeline)
    key = study_name(residual_spec, CPU, search.plan.config, search.plan.pipeline)
    assert legacy != key
    optuna.create_study(study_name=legacy, storage=search.store.url, directions=search.plan.objectives.directions())
    assert search.store.study_name == legacy
    assert search.store.open_study().user_attrs[ATTR_STUDY_KEY] == key
    with fold_installed():
        later = _search(residual_spec, tmp_path)
        assert legacy_study_name(residual_spec, CPU, later.plan.config, later.plan.pipeline) != legacy
        assert later.store.study_name == legacy


def test_the_first_lines_of_a_run_come_back_in_order_and_only_those_with_something_to_say() -> None:
    prepared = Prepared(Baseline(0.97, 1.0, 1000.0, 0), self_check_line="self-check", presets_line="presets")
    assert prepared.lines() == ["self-check", "presets"]
    assert replace(prepared, stages_line="stages").lines() == ["self-check", "stages", "presets"]


def test_a_study_records_its_runtimes_and_a_changed_set_asks_for_a_new_name_or_the_flag(
    residual_spec: ModelSpec, tmp_path: Path
) -> None:
    """The default runtimes are every runtime available here: a runtime installed later keeps the study's name,
    and resuming says what changed instead of widening the search silently."""
    config = SearchConfig.load(None, sampler="random", latency_budget="quick", exports="none", seeds=[])
    assert config.runtimes == ("all",)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = Search(residual_spec, CPU, config, storage=storage, track=False)
    study = first.store.open_study()
    assert study.user_attrs[ATTR_RUNTIMES] == list(first.plan.runtimes)
    with registered_runtime(_Extra()):
        widened = Search(residual_spec, CPU, config, storage=storage, track=False)
        assert widened.store.study_name == first.store.study_name, "a new runtime renames no study"
        assert "extra_test" in widened.plan.runtimes
        with pytest.raises(ConfigError, match=r"runtime\(s\) extra_test joined.*--accept-plugin-change"):
            widened.store.open_study()
        accepted = Search(residual_spec, CPU, config, storage=storage, track=False, accept_plugin_change=True)
        assert "extra_test" in accepted.store.open_study().user_attrs[ATTR_RUNTIMES]


class _Extra(Runtime):
    """A runtime installed after the study began."""

    name = "extra_test"

    def available(self, device: torch.device) -> bool:
        return True

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        return model


def test_a_default_study_named_with_the_old_runtime_list_resumes_under_its_name(
    residual_spec: ModelSpec, tmp_path: Path
) -> None:
    """Before ``runtimes: all`` the default listed the built-in runtimes, and the name hashed that list: such a
    study is found under its name, not orphaned by the new default."""
    config = SearchConfig.load(None, sampler="random", latency_budget="quick", exports="none", seeds=[])
    listed = config.model_copy(update={"runtimes": LEGACY_DEFAULT_RUNTIMES})
    old = study_name(residual_spec, CPU, listed, default_pipeline())
    assert old != study_name(residual_spec, CPU, config, default_pipeline())
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    search = Search(residual_spec, CPU, config, storage=storage, track=False)
    optuna.create_study(study_name=old, storage=storage, directions=search.plan.objectives.directions())
    assert search.store.study_name == old
