"""The front's rule: faster only with confidence and by the minimum effect, the metric compared with its bootstrap
interval, ties listed and led by the simplest recipe whose interval reaches them (trials off the point-value front
included), and a stage that changes nothing never displaces the baseline, even timed on a clock that favours
whichever side runs second (a search with a fake clock)."""

from __future__ import annotations

import inspect
import io
import math
from collections.abc import Iterator, Sequence

import optuna
import pytest
import torch
from optuna.study import StudyDirection
from optuna.trial import TrialState
from rich.console import Console

from paretorch.pipeline.core.paired import Timed
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, registered
from paretorch.pipeline.search import Search, SearchConfig, run_search
from paretorch.pipeline.search.front_rule import (
    MIN_EFFECT,
    beats,
    candidates,
    dominated_by,
    faster,
    front_groups,
    front_tags,
    tied,
)
from paretorch.pipeline.search.objectives import ATTR_METRICS, ATTR_RECIPE, ATTR_RECIPE_LINE, ATTR_SEED
from paretorch.pipeline.search.pareto import ParetoRow, distinct_front, pareto_rows, pareto_trials, remeasured_cell


def add(study: optuna.Study, metric: float, speedup: float, ci: tuple[float, float], stages: int = 0,
        runtime: str = "eager", recipe: str = "", feasible: bool = True) -> int:
    """A complete trial with a paired speed-up (latency objective 1 / speed-up), ``stages`` model stages."""
    raw = [{"stage": "toy.stage"} for _ in range(stages)] + [{"stage": "export.onnx"}]
    study.add_trial(optuna.trial.create_trial(
        values=[metric, 1.0 / speedup], state=TrialState.COMPLETE,
        user_attrs={ATTR_METRICS: {"speedup": speedup, "speedup_ci_low": ci[0], "speedup_ci_high": ci[1]},
                    ATTR_RECIPE: {"stages": raw, "runtime": runtime},
                    ATTR_RECIPE_LINE: recipe or f"recipe {len(study.trials)}"},
        system_attrs={"constraints:metric_drop": -0.01 if feasible else 0.5},
    ))
    return len(study.trials) - 1


def new_study() -> optuna.Study:
    return optuna.create_study(directions=["maximize", "minimize"])


def test_faster_needs_the_interval_cleared_and_the_minimum_effect() -> None:
    study = new_study()
    add(study, 0.9, 1.00, (0.99, 1.01))
    add(study, 0.9, 1.03, (1.02, 1.04))   # the no-op: clears the interval, but only 3 %
    add(study, 0.9, 1.20, (1.00, 1.40))   # 20 % faster, but the intervals overlap
    add(study, 0.9, 1.10, (1.08, 1.12))   # 10 % faster and cleared
    base, noop, wide, real = candidates(study)
    assert not faster(noop, base), f"within the {MIN_EFFECT:.0%} minimum effect"
    assert not faster(wide, base) and not faster(base, wide), "intervals overlap: a tie"
    assert faster(real, base) and not faster(base, real)


@pytest.mark.parametrize("int8_ci", [(4.85, 5.10), (4.89, 4.95)], ids=["reaches", "falls-short"])
def test_ties_go_to_the_simplest_recipe_whose_interval_reaches_them(int8_ci: tuple[float, float]) -> None:
    """The issue's digits front: three recipes at one accuracy, within noise of each other; Optuna's point-value
    front held only the three-stage one. The simpler int8 | ort leads the three-stage recipe tied with it only
    where its interval reaches that recipe's 5.08x; otherwise the fastest trial leads a row of its own."""
    study = new_study()
    add(study, 0.98, 1.00, (0.99, 1.01), recipe="baseline")
    three = add(study, 0.98, 5.08, (4.73, 5.18), stages=3, runtime="onnxruntime", recipe="prune+distill+int8 | ort")
    int8 = add(study, 0.98, 4.90, int8_ci, stages=1, runtime="onnxruntime", recipe="int8 | ort")
    plain = add(study, 0.98, 4.67, (4.63, 4.70), stages=0, runtime="onnxruntime", recipe="ort")
    slow = add(study, 0.97, 1.50, (1.45, 1.55), stages=1, recipe="worse and slower")
    assert {t.number for t in study.best_trials} == {three}, "point values: one trial"
    groups = front_groups(candidates(study))
    # int8 | ort clears ORT alone (4.85 > 4.70, 4.9 % faster) but not the three-stage recipe (4.73 < 4.95)
    reached = int8_ci[1] >= 5.08
    assert [(g.lead.trial.number, g.tied) for g in groups] == (
        [(int8, [three])] if reached else [(int8, []), (three, [])])
    assert pareto_trials(study) == [study.trials[n] for n in ([int8] if reached else [three, int8])]
    # the first front trial by number that beats them: three beats every trial int8 beats
    winner = int8 if reached else three
    assert dominated_by(study, pareto_trials(study)) == {0: winner, plain: winner, slow: winner}
    tags = front_tags(study, distinct_front(study), dominated_by(study, pareto_trials(study)))
    assert tags[int8] == {"pareto": "true"}
    assert tags[three] == ({"pareto": "false", "tied_with": str(int8)} if reached else {"pareto": "true"})
    assert tags[plain] == {"pareto": "false", "dominated_by": str(winner)}


def test_a_wide_lead_does_not_fold_a_trial_measured_clear_above_its_value() -> None:
    """The H200 MiniLM study (b256, serve): bf16 | compile timed 6 rounds, 2.33x [1.81, 3.33], and pack + fp16 |
    cudagraphs 2.85x [2.53, 3.01]. Neither is better with confidence (tied), and the simpler one's interval reaches
    2.85x; but the faster one's whole interval is above 2.33x, so it leads its own row and comes first (the bench
    and the console named bf16 | compile best while the best-so-far curve named the other)."""
    study = new_study()
    add(study, 44.33, 1.00, (1.00, 1.00), recipe="baseline")
    bf16 = add(study, 44.33, 2.33, (1.81, 3.33), stages=1, runtime="compile", recipe="bf16 | compile")
    packed = add(study, 44.33, 2.85, (2.53, 3.01), stages=2, runtime="compile_cudagraphs",
                 recipe="pack + fp16 | cudagraphs")
    lead, other = (c for c in candidates(study) if c.trial.number in (bf16, packed))
    assert tied(lead, other)
    groups = front_groups(candidates(study))
    assert [(g.lead.trial.number, g.tied) for g in groups if g.lead.trial.number != 0] == [(bf16, []), (packed, [])]
    assert study.trials[packed] in pareto_trials(study), "a lead of its own: on the front's list, ships deploy/"


def test_the_fewest_stages_lead_and_eager_before_another_runtime() -> None:
    study = new_study()
    ort = add(study, 0.98, 2.00, (1.90, 2.10), stages=0, runtime="onnxruntime")
    amp = add(study, 0.98, 2.05, (1.95, 2.15), stages=1)
    two = add(study, 0.98, 2.10, (2.00, 2.20), stages=2)
    groups = front_groups(candidates(study))
    assert [(g.lead.trial.number, sorted(g.tied)) for g in groups] == [(amp, [ort, two])], (
        "one stage eager and no stage under ONNX Runtime count alike; eager goes first")


def test_a_better_metric_at_a_tied_speed_wins_and_repeats_stay_repeats() -> None:
    study = new_study()
    first = add(study, 0.98, 2.00, (1.95, 2.05), stages=1, recipe="amp")
    worse = add(study, 0.97, 1.99, (1.94, 2.04), stages=1, recipe="int8")  # tied speed, lower metric: beaten
    again = add(study, 0.98, 2.01, (1.96, 2.06), stages=1, recipe="amp")
    off = add(study, 0.99, 9.00, (8.90, 9.10), stages=1, recipe="broken", feasible=False)
    groups = front_groups(candidates(study))
    assert [(g.lead.trial.number, g.repeats, g.tied) for g in groups] == [(first, [again], [])]
    assert dominated_by(study, pareto_trials(study)) == {worse: first}, "the infeasible trial is no one's to beat"
    assert off not in [t.number for t in pareto_trials(study)]


def test_a_better_metric_beats_only_a_speed_it_is_no_worse_than_at_both_ends_and_the_value() -> None:
    """Transitivity's price: a slower-looking interval, tied with confidence, is not "no worse", so the lower metric
    at a speed-up interval higher at both ends stays on the front, leading its own row (not tied: the metric is
    better with confidence)."""
    study = new_study()
    first = add(study, 0.98, 2.00, (1.95, 2.05), stages=1, recipe="amp")
    worse = add(study, 0.97, 2.02, (1.97, 2.07), stages=1, recipe="int8")
    groups = front_groups(candidates(study))
    assert [(g.lead.trial.number, g.tied) for g in groups] == [(first, []), (worse, [])]


def test_the_metric_compares_with_its_bootstrap_interval_either_way_the_metric_points() -> None:
    """The stored drop's interval becomes the metric's: a lower accuracy within its noise is no longer beaten by the
    other's value; a loss (lower is better) turns the same way."""
    for direction, sign in ((StudyDirection.MAXIMIZE, 1.0), (StudyDirection.MINIMIZE, -1.0)):
        study = optuna.create_study(directions=[direction, StudyDirection.MINIMIZE])
        for metric, drop, speedup in ((0.9950, 0.0, 4.35), (0.9924, 0.0026, 4.77)):
            study.add_trial(optuna.trial.create_trial(
                values=[sign * metric, 1.0 / speedup], state=TrialState.COMPLETE,
                user_attrs={ATTR_METRICS: {"speedup": speedup, "speedup_ci_low": speedup - 0.3,
                                           "speedup_ci_high": speedup + 0.3, "metric_drop": drop,
                                           "metric_drop_ci_low": drop - 0.002, "metric_drop_ci_high": drop + 0.003},
                            ATTR_RECIPE: {"stages": [], "runtime": "eager"}},
                system_attrs={"constraints:metric_drop": -0.01}))
        good, wide = candidates(study)
        assert good.metric_ci == pytest.approx((0.9950 - 0.003, 0.9950 + 0.002))
        assert wide.metric_ci == pytest.approx((0.9924 - 0.003, 0.9924 + 0.002))
        assert not beats(good, wide) and tied(good, wide), f"{direction}: within the metric's noise"
        assert [g.lead.trial.number for g in front_groups([good, wide])] == [0, 1], "0 cannot reach 4.77x"


def test_a_remeasure_outside_the_search_interval_is_flagged() -> None:
    row = ParetoRow(trial=1, metric=0.9, drop=0.0, latency_ms=0.2, speedup=5.08, size_bytes=1.0, recipe="r",
                    exports="", speedup_ci=(4.73, 5.18), remeasured=4.68)
    assert row.outside and remeasured_cell(row) == "4.68x outside"
    inside = ParetoRow(trial=1, metric=0.9, drop=0.0, latency_ms=0.2, speedup=5.08, size_bytes=1.0, recipe="r",
                       exports="", speedup_ci=(4.73, 5.18), remeasured=4.9)
    assert not inside.outside and remeasured_cell(inside) == "4.90x"
    assert remeasured_cell(ParetoRow(1, 0.9, 0.0, 0.2, 5.0, 1.0, "r", "")) == "-"


# --------------------------------------------------------------------------- a no-op stage in a search


#: The no-op stage (the tag_stage fixture, tests/pipeline/search/conftest.py) by label: its time per call, 2.5 %
#: faster in every round for "steady" (a systematic advantage under the minimum effect).
NOOP_MS = {"steady": 0.975, "plain": 1.0}
#: What the first place in a round costs (the bias a fixed order put on the baseline).
FIRST_PLACE = 0.05


class FirstPlaceClock:
    """Each model's time (1 ms, a no-op's per its tag), plus :data:`FIRST_PLACE` for whichever runs first."""

    def warm_up(self, sides: Sequence[Timed]) -> None:
        pass

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        times = [NOOP_MS.get(getattr(inspect.unwrap(fn), "paretorch_label", ""), 1.0) for fn, _ in sides]
        return [t * (1.0 + FIRST_PLACE) if place == 0 else t for place, t in enumerate(times)]


@pytest.fixture(scope="module")
def noop_search(residual_spec: ModelSpec, tag_stage: Stage,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Search]:
    folder = tmp_path_factory.mktemp("noop")
    pipeline_file = folder / "noop.yaml"
    pipeline_file.write_text("nodes:\n  - {op: model}\n  - {op: toy.tag}\n  - {name: evaluate, op: evaluate}\n")
    seeds = [{"name": tag, "stages": [{"stage": "toy.tag", "label": tag}]} for tag in NOOP_MS]
    config = SearchConfig.load(None, pipeline=str(pipeline_file), sampler="random", runtimes=("eager",),
                               latency_budget="quick", exports="none", seeds=seeds)
    with registered(tag_stage):
        search = Search(residual_spec, torch.device("cpu"), config, storage=f"sqlite:///{folder / 'optuna.db'}",
                        track=False)
        search.model.latency.timer = FirstPlaceClock()
        search.model.latency.cpu_clock = None
        search.outcome = run_search(search, trials=3, console=Console(file=io.StringIO(), width=200))  # type: ignore[attr-defined]
        yield search


def test_a_stage_that_changes_nothing_never_displaces_the_baseline(noop_search: Search) -> None:
    study = noop_search.outcome.study  # type: ignore[attr-defined]
    by_seed = {t.user_attrs.get(ATTR_SEED): t for t in study.trials}
    baseline, steady, plain = by_seed["baseline"], by_seed["steady"], by_seed["plain"]
    speedups = {name: t.user_attrs[ATTR_METRICS] for name, t in by_seed.items()}
    # the alternating order: the baseline timed against itself covers 1.0 although the first place costs 5 %
    base = speedups["baseline"]
    assert base["speedup_ci_low"] <= 1.0 <= base["speedup_ci_high"]
    assert math.isclose(base["speedup"], 1.0, abs_tol=0.002)
    # the steady no-op looks 2.5 % faster; on point values it alone is the front
    assert speedups["steady"]["speedup"] > 1.02
    assert [t.number for t in study.best_trials] == [steady.number]
    # the front: the baseline, with both no-ops tied with it
    assert [t.number for t in pareto_trials(study)] == [baseline.number]
    rows = pareto_rows(study, noop_search.plan.objectives)
    assert [(r.trial, r.ties) for r in rows] == [(baseline.number, tuple(sorted((steady.number, plain.number))))]
    table = Console(file=io.StringIO(), width=200)
    table.print(noop_search.outcome.table)  # type: ignore[attr-defined]
    assert f"~ {min(steady.number, plain.number)}, {max(steady.number, plain.number)}" in table.file.getvalue()  # type: ignore[attr-defined]
