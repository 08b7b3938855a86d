"""The stage contract (:class:`paretorch.testing.StageContract`, the class a plugin's own tests subclass), run over
every registered stage and a third-party toy stage, and the toy stage end to end.

Parametrized over the registry: a new stage is held to the contract with no new test code. The toy stage
(``tests/stages/toy_plugin``) is a separate package installed with pip into a temporary folder; it is found through
its entry point, like the built-ins, and run through ``python -m paretorch optimize`` (what ``make optimize`` runs).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from paretorch.pipeline.core.stage import ENTRY_POINT_GROUP, Stage, StageConfig, registered_stages
from paretorch.pipeline.engine.graph import default_pipeline
from paretorch.testing import StageContract

TOY_STAGE = "toy.scale_bias"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def toy_stage(toy_plugins_loaded: None) -> Stage[StageConfig]:
    """The toy stage, registered through its entry point (``toy_plugins_loaded`` in conftest.py)."""
    return registered_stages()[TOY_STAGE]


def _stage_names() -> list[str]:
    names = sorted(registered_stages())
    return names if TOY_STAGE in names else [*names, TOY_STAGE]  # under --toy-plugin it is registered already


class TestEveryStage(StageContract):
    """The contract over every registered stage, and the toy stage of a separately installed package."""

    @pytest.fixture(params=_stage_names())
    def stage(self, request: pytest.FixtureRequest) -> Stage[StageConfig]:
        if request.param == TOY_STAGE:
            stage: Stage[StageConfig] = request.getfixturevalue("toy_stage")
            return stage
        return registered_stages()[request.param]


def test_every_builtin_stage_is_declared_as_an_entry_point() -> None:
    names = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert {"prune", "distill", "quantize", "amp", "export.coreml", "export.onnx", "export.pt2"} <= names
    assert names <= set(registered_stages())


# --------------------------------------------------------------------------- the toy stage, end to end


def test_toy_stage_sits_where_it_says_in_the_default_pipeline(
    toy_stage: Stage, default_stages: tuple[list[str], list[str]]
) -> None:
    """Order 20, as distill: equal orders sort by name, so after distill; before pack (25)."""
    model_stages, exports = default_stages  # the registry's stages by (order, name), the toy's included
    pipeline = default_pipeline()
    assert pipeline.describe() == " -> ".join(["model", *model_stages, "{" + ", ".join(exports) + "}"])
    chain = [n.name for n in pipeline.model_stage_nodes()]
    assert chain.index("prune") < chain.index("distill") < chain.index(TOY_STAGE) < chain.index("pack")
    assert all(pipeline.node(name).inputs == (chain[-1],) for name in exports), "exports read the last model stage"


def test_toy_stage_runs_through_optimize(toy_plugin_site: Path, tmp_path: Path) -> None:
    """``python -m paretorch optimize`` finds the installed toy stage, searches it (on/off and its integer are the
    study's params) and runs it: a recipe with it is enqueued, so the test does not hang on the sampler's draws."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_plugin_site), str(REPO)]),
           "PARETORCH_RESULTS_DIR": str(tmp_path)}
    recipe = tmp_path / "toy-twice.json"
    recipe.write_text(json.dumps({"stages": [{"stage": TOY_STAGE, "repeats": 2}], "runtime": "eager"}))
    run = subprocess.run(
        [sys.executable, "-m", "paretorch", "optimize", "--model", "digits", "--trials", "5", "--no-tracking",
         "--runtimes", "eager", "--latency-budget", "quick", "--exports", "none", "--disable", "prune,distill,amp",
         "--threads", "1", "--enqueue", str(recipe)],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    [summary] = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    recipes = [t.user_attrs["paretorch.recipe"] for t in study.trials if "paretorch.recipe" in t.user_attrs]
    toy_runs = [r for r in recipes if any(s["stage"] == TOY_STAGE for s in r["stages"])]
    assert toy_runs, f"no trial ran the toy stage: {[r['stages'] for r in recipes]}"
    assert any(s.get("repeats") == 2 for r in toy_runs for s in r["stages"] if s["stage"] == TOY_STAGE)
    assert any("toy.scale_bias.on" in t.params for t in study.trials), "the search samples it"
    assert all([s["stage"] for s in r["stages"]].index(TOY_STAGE) == 0 for r in toy_runs)
