"""Search quality from stored studies: feasibility and scales read from storage alone, the ratios after
``--compare`` trials, one ``error:`` line for each bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from paretorch.experiments.bench.render import render_markdown
from paretorch.experiments.bench.search_quality import analyse, main, render
from paretorch.experiments.bench.study_points import study_points
from paretorch.pipeline.search.objectives import ATTR_BASELINE, ATTR_RECIPE_LINE, ATTR_REPEAT_OF, ATTR_SEARCH

BASELINE = {"metric_value": 0.9, "latency_ms": 8.0, "size_bytes": 100.0, "trial": 0}
SEARCH = {"pipeline": "default", "objectives": ["metric", "latency"], "max_drop": 0.01, "sampler": "tpe", "seed": 0,
          "runtimes": ["eager"], "latency_budget": "normal", "latency_batch": None, "disabled": []}


def make_study(storage: str | None, name: str, trials: list[tuple[float, float, float]], seed: int = 0,
               **search: Any) -> optuna.Study:
    """A study as the search leaves it: (accuracy, latency ms, constraint) per trial; NaN accuracy = failed."""
    study = optuna.create_study(storage=storage, study_name=name, directions=["maximize", "minimize"])
    study.set_user_attr(ATTR_BASELINE, BASELINE)
    study.set_user_attr(ATTR_SEARCH, {**SEARCH, "seed": seed, **search})
    for accuracy, latency, constraint in trials:
        if math.isnan(accuracy):
            study.add_trial(create_trial(state=TrialState.FAIL))
        else:
            study.add_trial(create_trial(values=[accuracy, latency], constraints={"metric_drop": constraint}))
    return study


# baseline 0.9 / 8 ms, allowed drop 0.01: (drop share, speed-up) = (0, 1), (0.5, 4), over the drop, (0, 2), failed
TRIALS = [(0.9, 8.0, -0.01), (0.895, 2.0, -0.005), (0.85, 1.0, 0.04), (0.91, 4.0, -0.02), (math.nan, 0, 0)]


def test_points_read_drop_and_speed_up_from_the_stored_baseline_and_constraint() -> None:
    points = study_points(make_study(None, "s", TRIALS)).points
    assert [(p.number, p.feasible) for p in points] == [(0, True), (1, True), (2, False), (3, True), (4, False)]
    assert math.isclose(points[1].drop_share, 0.5) and points[1].speedup == 4.0
    assert math.isclose(points[3].drop_share, -1.0) and points[3].speedup == 2.0


def test_a_lower_is_better_metric_and_a_relative_drop() -> None:
    study = optuna.create_study(directions=["minimize", "minimize"])
    study.set_user_attr(ATTR_BASELINE, {**BASELINE, "metric_value": 2.0})
    study.set_user_attr(ATTR_SEARCH, {**SEARCH, "max_drop": "10%"})
    study.add_trial(create_trial(values=[2.1, 4.0], constraints={"metric_drop": -0.1}))
    (point,) = study_points(study).points
    assert math.isclose(point.drop_share, 0.5) and point.speedup == 2.0


def test_repeats_do_not_count_as_trials() -> None:
    study = make_study(None, "s", TRIALS[:2])
    study.add_trial(create_trial(state=TrialState.PRUNED, user_attrs={ATTR_REPEAT_OF: 1}))
    assert study_points(study).trials == 2


def test_the_recipe_is_read_without_its_exports() -> None:
    study = make_study(None, "s", [])
    study.add_trial(create_trial(values=[0.9, 4.0], constraints={"metric_drop": -0.01},
                                 user_attrs={ATTR_RECIPE_LINE: "prune(ratio=0.3) | compile | -> coreml, onnx"}))
    (point,) = study_points(study).points
    assert point.recipe == "prune(ratio=0.3) | compile" and point.study == "s"


def test_ratios_after_compare_trials_against_the_longest_run_and_the_union() -> None:
    long = study_points(make_study(None, "long", TRIALS, seed=0))
    # the short run finds 2x at no drop only: ln 2 against the long run's ln 2 + 0.5 * (ln 4 - ln 2)
    short = study_points(make_study(None, "short", [(0.9, 8.0, -0.01), (0.9, 4.0, -0.01)], seed=1))
    result = analyse([long, short], compare=2)
    assert result["reference"] == "long"
    expected_long = math.log(2) + 0.5 * math.log(2)
    assert math.isclose(result["hv_reference"], expected_long) and math.isclose(result["hv_union"], expected_long)
    runs = {r["study"]: r for r in result["runs"]}
    assert math.isclose(runs["long"]["hv_at_compare"], 0.5 * math.log(4))  # 4x at half the drop
    assert math.isclose(runs["short"]["vs_reference"], math.log(2) / expected_long)
    assert result["reached_reference"] is False and result["reached_union"] is False
    # 2x at no drop: the short run's trial 1 found it before the long run's trial 3
    assert [(r["study"], r["trial"]) for r in result["union_front"]] == [("long", 1), ("short", 1)]


def test_render_and_files_from_a_stored_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    make_study(storage, "long", TRIALS)
    make_study(storage, "other", TRIALS[:1])
    out = tmp_path / "out"
    assert main(["--storage", storage, "--study", "long", "--compare", "4", "--trials", "4", "--model", "m",
                 "--device", "cuda", "--out", str(out)]) == 0
    result = json.loads((out / "search-quality-m-cuda.json").read_text())
    assert (out / "search-quality-m-cuda.png").stat().st_size > 0
    # the failed trial 4 counts as a trial and adds nothing
    assert [r["study"] for r in result["runs"]] == ["long"] and result["runs"][0]["history"] == pytest.approx(
        [0.0, math.log(4) / 2, math.log(4) / 2, 1.5 * math.log(2), 1.5 * math.log(2)])
    text = render(result)
    assert "| long | 0 | 5 | 0 | 3 (0) | 1.040 | 1.040 | 100.0 % | 100.0 % |" in text and "**yes**" in text
    assert text.endswith("![hypervolume against trials](experiments/bench/results/search-quality-m-cuda.png)")
    assert "Front of long after 4 trials: #1 4.00x at 50 % of the drop; #3 2.00x at 0 % of the drop; after 5:" in text
    assert "Union front: #1 4.00x at 50 % of the drop (long); #3 2.00x at 0 % of the drop (long)." in text
    # BENCHMARKS.md takes the file as its own section, not as a benchmark table
    markdown = render_markdown(out)
    assert "### Search quality: m on cuda (hypervolume against trials)" in markdown and "| recipe |" not in markdown


@pytest.mark.parametrize(("argv", "message"), [
    (["--trials", "10", "--compare", "30"], "--compare 30 is more than --trials 10"),
    (["--study", "x"], "--study needs --storage"),
    (["--storage", "sqlite:///{tmp}/empty.db"], "no study in"),
    (["--storage", "sqlite:///{tmp}/s.db", "--study", "missing"], "no study 'missing' in"),
    (["--storage", "sqlite:///{tmp}/bare.db"], "has no paretorch baseline or search config"),
    (["--storage", "sqlite:///{tmp}/mixed.db"], "search different things (latency_batch: None vs 256)"),
])
def test_each_bad_input_is_one_error_line(argv: list[str], message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    make_study(f"sqlite:///{tmp_path / 's.db'}", "s", TRIALS)
    optuna.create_study(storage=f"sqlite:///{tmp_path / 'bare.db'}", study_name="bare")
    make_study(f"sqlite:///{tmp_path / 'mixed.db'}", "b1", TRIALS)
    make_study(f"sqlite:///{tmp_path / 'mixed.db'}", "b256", TRIALS, latency_batch=256)
    code = main([a.format(tmp=tmp_path) for a in argv] + ["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "out").exists()
