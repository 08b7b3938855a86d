"""`python -m paretorch apply`: as quiet as optimize (third-party output to its log file), and the numbers the
search recorded for the trial printed beside the replay's own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Self

import optuna
import pytest
import torch
from torch import nn

from paretorch.pipeline.cli.main import main
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, registered
from paretorch.pipeline.search import Search, SearchConfig, run_search
from paretorch.pipeline.search.objectives import ATTR_METRICS, ATTR_RECIPE
from paretorch.pipeline.search.recorded import RECORDED, latency_key
from paretorch.pipeline.sources.resolve import resolve_spec

SPEC_SOURCE = '''
import torch
from torch import nn
from paretorch.pipeline.core.fidelity import fidelity_spec

DATA = torch.randn(96, 8, generator=torch.Generator().manual_seed(0))


def spec():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    return fidelity_spec("tiny", lambda: model, lambda b: (DATA[:b],), lambda: [(DATA[:32],)],
                         lambda: [(DATA[32:64],), (DATA[64:96],)], latency_batch_sizes=(4,))
'''
CHATTER = "a third-party library's chatter"


class NoisyConfig(StageConfig):
    """Leaves the model as it is and writes to standard error, as third-party libraries do."""

    stage = "toy.noisy"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        return None


def apply_noisy(model: nn.Module, config: NoisyConfig, ctx: StageContext) -> nn.Module:
    os.write(2, f"{CHATTER} (C level)\n".encode())
    print(f"{CHATTER} (Python)", file=sys.stderr)  # Python warnings go the same way (pytest records them here)
    return model


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(SPEC_SOURCE)
    return path


def write_recipe(path: Path, metadata: dict[str, object]) -> Path:
    path.write_text(json.dumps({"format": "paretorch-recipe/1", "model": "tiny", "runtime": "eager",
                                "stages": [{"stage": "toy.noisy"}], "metadata": metadata}))
    return path


def apply(spec_file: Path, recipe: Path, out: Path, *extra: str) -> int:
    return main(["apply", "--recipe", str(recipe), "--model", f"{spec_file}:spec", "--device", "cpu",
                 "--results-dir", str(out.parent / "results"), "--output", str(out), "--no-export",
                 "--latency-budget", "quick", "--threads", "1", *extra])


def test_apply_is_quiet_and_prints_the_recorded_numbers_beside_its_own(
    spec_file: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    metric = resolve_spec(f"{spec_file}:spec").metric.name
    recorded = {"device": "cpu (AVX2, 1 threads)", metric: 0.5, "metric_drop": 0.01, latency_key(4): 1.234,
                "speedup": 2.5}
    recipe = write_recipe(tmp_path / "recipe.json", {"study": "s", "trial": 7, RECORDED: recorded})
    out = tmp_path / "out"
    with registered(Stage(NoisyConfig, apply_noisy)):
        assert apply(spec_file, recipe, out) == 0
    console, err = capfd.readouterr()
    assert CHATTER not in console + err, "third-party output goes to the log file, as optimize sends it"
    log = (out / "third-party.log").read_text()
    assert all(f"{CHATTER} ({where})" in log for where in ("C level", "Python"))
    assert f"third-party warnings and progress bars: {out / 'third-party.log'}" in console
    assert "toy.noisy | eager" in console, "the title names the recipe in the short notation"
    assert "search (trial 7)" in console
    line = {name: next(x for x in console.splitlines() if x.lstrip().startswith(name))
            for name in (metric, "latency batch 4", "speed-up", "device")}
    assert "0.5000 (drop +0.0100)" in line[metric] and "1.234 ms" in line["latency batch 4"]
    assert "2.50x (paired, vs the baseline)" in line["speed-up"] and "cpu (AVX2, 1 threads)" in line["device"]
    written = json.loads((out / "apply.json").read_text())
    assert written["recorded"] == recorded
    assert "inputs_broken_share" in written["metrics"], "the replay against the unoptimized model, input by input"
    assert isinstance(written["worst_inputs"], list)
    assert any(x.startswith("inputs: ") and "against the unoptimized model" in x for x in console.splitlines())


def test_a_recipe_without_recorded_numbers_says_so(spec_file: Path, tmp_path: Path,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    recipe = write_recipe(tmp_path / "old.json", {"study": "s", "trial": 3})
    with registered(Stage(NoisyConfig, apply_noisy)):
        assert apply(spec_file, recipe, tmp_path / "out") == 0
    assert "recorded: none in this recipe file" in capfd.readouterr().out


def test_the_search_records_the_trials_numbers_in_its_recipe(residual_spec: ModelSpec, tmp_path: Path) -> None:
    config = SearchConfig.load(None, sampler="random", runtimes=("eager",), latency_budget="quick", exports="none",
                               seeds=[], disabled=("prune", "distill", "pack", "quantize", "amp"))
    search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{tmp_path / 'o.db'}",
                    track=False)
    trial = run_search(search, trials=1).study.trials[0]
    recorded = trial.user_attrs[ATTR_RECIPE]["metadata"][RECORDED]
    metrics = trial.user_attrs[ATTR_METRICS]
    assert recorded["accuracy"] == metrics["accuracy"] and recorded["speedup"] == metrics["speedup"]
    assert recorded[latency_key(search.plan.objectives.latency_batch)] > 0 and recorded["device"].startswith("cpu")
