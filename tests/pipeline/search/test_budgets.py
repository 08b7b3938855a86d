"""Output-error budgets are logged next to the task metric's verdict (issue: budgets vs the task metric)."""

from __future__ import annotations

import pytest

from paretorch.pipeline.search.stage_records import budget_metrics
from paretorch.stages.amp.stage import AmpConfig
from paretorch.stages.prune.stage import PruneConfig
from paretorch.stages.quantize.stage import QuantizeConfig


def test_a_budget_that_kept_layers_float_is_logged_with_the_task_headroom() -> None:
    stages = [
        PruneConfig(ratio=0.3),
        QuantizeConfig(method="int8_dynamic", fallback_budget=0.01, float_layers=("a.0", "b.1")),
        AmpConfig(dtype="bfloat16", error_budget=0.02, fp32_layers=("head",)),
    ]
    metrics = budget_metrics(stages, headroom=0.004)  # drop 0.004 under the allowed one
    assert metrics["quantize.fallback_budget"] == pytest.approx(0.01)
    assert metrics["quantize.fallback_budget_float_layers"] == 2
    assert metrics["amp.error_budget"] == pytest.approx(0.02)
    assert metrics["amp.error_budget_float_layers"] == 1
    assert metrics["drop_headroom"] == pytest.approx(0.004)


def test_no_budget_held_logs_nothing() -> None:
    stages = [QuantizeConfig(method="int8_dynamic"), QuantizeConfig(method="int8_dynamic", fallback_budget=0.01,
                                                                      float_layers=())]
    assert budget_metrics(stages, headroom=-0.5) == {}
