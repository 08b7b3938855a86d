"""``--max-drop``: absolute (``0.01``) or relative to the baseline metric (``1%``), judged in one place."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from pydantic import Field

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.spec import Metric, ModelSpec
from paretorch.pipeline.engine.graph import default_pipeline
from paretorch.pipeline.search import Search, SearchConfig, run_search, study_name
from paretorch.pipeline.search.allowed_drop import AllowedDrop
from paretorch.pipeline.search.loop import trial_parts
from paretorch.pipeline.search.objectives import ATTR_FEASIBLE, ATTR_REASON, CONSTRAINT_NAME, Baseline, Objectives
from paretorch.pipeline.search.record import TrialRecord
from paretorch.pipeline.search.store import Prepared

PRUNE_HARD = {"stage": "prune", "method": "unstructured", "ratio": 0.9}


@pytest.mark.parametrize(("given", "kind", "amount", "written"), [
    ("0.01", "absolute", 0.01, "0.01"),
    (0.01, "absolute", 0.01, "0.01"),
    ("0", "absolute", 0.0, "0"),
    ("1%", "relative", 0.01, "1%"),
    (" 2.5 % ", "relative", 0.025, "2.5%"),
    ("0%", "relative", 0.0, "0%"),
    ("100%", "relative", 1.0, "100%"),
])
def test_parse(given: str | float, kind: str, amount: float, written: str) -> None:
    allowed = AllowedDrop.parse(given)
    assert (allowed.kind, allowed.given()) == (kind, written)
    assert allowed.amount == pytest.approx(amount)


@pytest.mark.parametrize(("given", "message"), [
    ("abc", "--max-drop abc: not a number; give an absolute drop of the metric (e.g. 0.01) or a percentage"),
    ("", "--max-drop : not a number"),
    ("nan", "--max-drop nan: not a number"),
    ("-0.5", "--max-drop -0.5: a drop cannot be negative; give an absolute drop"),
    ("-1%", "--max-drop -1%: a relative drop must be between 0% and 100% of the baseline metric (e.g. 1%)"),
    ("150%", "--max-drop 150%: a relative drop must be between 0% and 100% of the baseline metric (e.g. 1%)"),
    ("1%%", "--max-drop 1%%: not a percentage; write one number and one % sign (e.g. 1%)"),
    ("%", "--max-drop %: not a percentage"),
])
def test_each_bad_value_is_one_config_error_naming_the_flag(given: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        AllowedDrop.parse(given)
    assert str(raised.value).startswith(message)
    with pytest.raises(ConfigError) as from_config:
        SearchConfig.load(None, max_drop=given)
    assert str(from_config.value) == str(raised.value), "the search config raises the same one error"


def test_a_relative_threshold_is_a_share_of_the_baseline() -> None:
    allowed = AllowedDrop.parse("1%")
    assert allowed.threshold(0.8203) == pytest.approx(0.008203)
    assert allowed.describe(0.9822) == "1% of the baseline 0.9822 = 0.009822 absolute"
    assert allowed.describe() == "1% of the baseline"
    assert AllowedDrop.parse("0.01").threshold(0.8203) == 0.01
    assert AllowedDrop.parse("0.01").describe(0.8203) == "0.01 absolute"
    for baseline in (0.0, -2.0):
        with pytest.raises(ConfigError, match=r"^--max-drop 1% \(the default\): a relative drop needs a positive "
                                              r"baseline metric.*"
                                              r"give an absolute drop instead \(e.g. --max-drop 0.01\)"):
            allowed.threshold(baseline)
        with pytest.raises(ConfigError, match=r"^--max-drop 2%: a relative drop needs a positive baseline metric"):
            AllowedDrop.parse("2%").threshold(baseline)


def test_a_lower_is_better_metric_drops_upward(residual_spec: ModelSpec) -> None:
    loss = Metric("loss", higher_is_better=False, compute=lambda outputs, targets: outputs.mean())
    objectives = Objectives.create(replace(residual_spec, metric=loss), ["metric", "latency"], "10%", 1)
    baseline = Baseline(metric_value=2.0, latency_ms=1.0, size_bytes=1.0)
    assert objectives.threshold(baseline) == pytest.approx(0.2) and objectives.limit(baseline) == pytest.approx(2.2)
    assert objectives.verdict(baseline, 2.15).feasible and objectives.verdict(baseline, 1.5).feasible
    over = objectives.verdict(baseline, 2.3)
    assert not over.feasible and over.constraint == pytest.approx(0.1)
    assert over.reason == "drop 0.3000 > allowed 0.2 (10% of the baseline 2)"


def test_an_absolute_drop_beyond_the_metric_range_is_refused_but_any_percentage_is_not(
    residual_spec: ModelSpec,
) -> None:
    with pytest.raises(ConfigError, match=r"^--max-drop 5: accuracy lies in \[0, 1\]"):
        Objectives.create(residual_spec, ["metric", "latency"], "5")
    assert Objectives.create(residual_spec, ["metric", "latency"], "100%").allowed_drop.kind == "relative"


class _SearchConfigBefore(SearchConfig):
    """The search config as it was before relative drops: ``max_drop`` a plain float field."""

    max_drop: float = Field(default=0.01, ge=0.0)  # type: ignore[assignment]


def test_an_absolute_drop_keeps_its_study_name_and_a_relative_one_gets_its_own(residual_spec: ModelSpec) -> None:
    cpu, pipeline = torch.device("cpu"), default_pipeline()
    before = study_name(residual_spec, cpu, _SearchConfigBefore.load(None, max_drop=0.01), pipeline)
    for given in (0.01, "0.01", "0.010"):
        config = SearchConfig.load(None, max_drop=given)
        assert config.identity()["max_drop"] == 0.01 and isinstance(config.identity()["max_drop"], float)
        assert study_name(residual_spec, cpu, config, pipeline) == before
    relative = SearchConfig.load(None, max_drop="1%")
    assert relative.identity()["max_drop"] == "1%"
    assert study_name(residual_spec, cpu, relative, pipeline) != before
    # the default is now 1 % of the baseline (issue 35): the same study as an explicit --max-drop 1%
    assert study_name(residual_spec, cpu, SearchConfig.load(None), pipeline) == study_name(
        residual_spec, cpu, relative, pipeline)


def _prune_search(spec: ModelSpec, folder: Path, max_drop: str) -> tuple[Search, Baseline]:
    """The baseline and one hard prune (it loses accuracy) on the residual MLP; the search and its baseline. The tail
    guard is off: the hard prune flips many confident inputs, which it would rule out at any allowed drop."""
    config = SearchConfig.load(None, max_drop=max_drop, sampler="random", runtimes=("eager",),
                               latency_budget="quick", exports="none", tail_limit="off",
                               seeds=[{"name": "prune-0.9", "stages": [PRUNE_HARD]}])
    database = folder / f"drop-{max_drop.rstrip('%')}-percent.db"
    search = Search(spec, torch.device("cpu"), config, storage=f"sqlite:///{database}", track=False)
    return search, run_search(search, trials=2).baseline


def test_the_allowed_drop_moves_the_tag_the_constraint_and_the_sweep_together(
    residual_spec: ModelSpec, tmp_path: Path
) -> None:
    """The same hard prune, within 100% of the baseline and over 0%: its feasibility tag, its Optuna
    constraint and what the runtime sweep counts as feasible all follow the allowed drop."""
    seen = {}
    for max_drop in ("100%", "0%"):
        search, baseline = _prune_search(residual_spec, tmp_path, max_drop)
        study = search.store.open_study(create=False)
        pruned = study.trials[1]
        assert pruned.user_attrs.get("paretorch.seed") == "prune-0.9"
        record = TrialRecord.from_trial(pruned)
        _objective, proposals = trial_parts(search, Prepared(baseline))
        drop = record.metrics["metric_drop"]
        assert drop > 0, "the hard prune loses accuracy"
        assert record.metrics["metric_drop_relative"] == pytest.approx(drop / baseline.metric_value)
        threshold = search.plan.objectives.threshold(baseline)
        assert pruned.constraints[CONSTRAINT_NAME] == pytest.approx(drop - threshold)
        seen[max_drop] = (pruned.user_attrs[ATTR_FEASIBLE], proposals.feasible_latency(record) is not None,
                          pruned.constraints[CONSTRAINT_NAME] <= 0)
        if max_drop == "0%":
            assert pruned.user_attrs[ATTR_REASON] == (f"over the allowed drop: drop {drop:.4f} > allowed 0 "
                                                      f"(0% of the baseline {baseline.metric_value:.4g})")
    assert seen == {"100%": (True, True, True), "0%": (False, False, False)}


def test_an_unknown_runtime_name_is_one_config_error() -> None:
    """A runtime this device lacks is dropped later; a name no device has is a typo, said at once."""
    with pytest.raises(ConfigError, match=r"--runtimes: .*unknown runtime\(s\) bogus: choose from eager"):
        SearchConfig.load(None, runtimes=("eager", "bogus"))
    assert SearchConfig.load(None, runtimes=("eager", "onnxruntime")).runtimes == ("eager", "onnxruntime")
