"""Output-error budgets next to the task metric's verdict.

Quantization's float fallback and AMP's calibration keep layers in float to hold an
*output-error* budget: a proxy for ranking layers. A trial's verdict is always the task
metric (:meth:`paretorch.pipeline.search.objectives.Objectives.verdict`). Logging both per trial shows
a budget that is stricter than the task needs: layers kept in float while the task metric
still has headroom under the allowed drop (a looser budget, or none, may be accepted).
"""

from __future__ import annotations

from collections.abc import Iterable

from paretorch.pipeline.core.stage import StageConfig


def budget_metrics(stages: Iterable[StageConfig], headroom: float) -> dict[str, float]:
    """Per budget held: its value and the layers kept in float for it; with any, the task metric's
    headroom (allowed drop minus drop; > 0: the task metric would have allowed more)."""
    metrics: dict[str, float] = {}
    for config in stages:
        use = config.budget_use()
        if use is None:
            continue
        metrics[use.name] = use.budget
        metrics[f"{use.name}_float_layers"] = float(use.float_layers)
    if metrics:
        metrics["drop_headroom"] = headroom
    return metrics
