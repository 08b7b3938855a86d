"""What a trial's stages recorded, as its run shows it: output-error budgets next to the verdict, and per-layer
tables of why a recipe costs accuracy.

**Budgets.** Quantization's float fallback and AMP's calibration keep layers in float to hold an *output-error*
budget: a proxy for ranking layers. A trial's verdict is always the task metric
(:meth:`paretorch.pipeline.search.objectives.Objectives.verdict`). Logging both per trial (:func:`budget_metrics`)
shows a budget that is stricter than the task needs: layers kept in float while the task metric still has headroom
under the allowed drop (a looser budget, or none, may be accepted).

**Sensitivity tables.** AMP calibration records ``amp.sensitivity`` ({layer: output error with that layer alone in the
reduced dtype}) and ``amp.pinned`` ({layer: why it stays float32}); the resolved config names the layers kept in
float32. :func:`sensitivity_tables` turns them into one CSV per node, logged as an artifact of the trial's run (which
layers cost accuracy, which stayed in float).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from typing import Any

from paretorch.pipeline.core.stage import StageConfig

SENSITIVITY_RECORD = "amp.sensitivity"
PINNED_RECORD = "amp.pinned"


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


def sensitivity_csv(sensitivity: Mapping[str, float], kept_float: set[str], pinned: Mapping[str, str]) -> str:
    """``layer,error_alone_reduced,kept_float32,why`` rows, costliest layer first."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["layer", "error_alone_reduced", "kept_float32", "why"])
    for layer, error in sorted(sensitivity.items(), key=lambda item: -float(item[1])):
        writer.writerow([layer, f"{float(error):.4g}", str(layer in kept_float).lower(), pinned.get(layer, "")])
    return out.getvalue()


def sensitivity_tables(nodes: Mapping[str, Any]) -> dict[str, str]:
    """``{"<node>_sensitivity.csv": csv}`` for each node of a run that recorded a calibration."""
    tables: dict[str, str] = {}
    for name, node in nodes.items():
        records = getattr(node, "records", None) or {}
        if SENSITIVITY_RECORD not in records:
            continue
        resolved: StageConfig | None = getattr(node, "resolved", None)
        kept = set(getattr(resolved, "fp32_layers", None) or ())
        tables[f"{name.replace('#', '_')}_sensitivity.csv"] = sensitivity_csv(
            records[SENSITIVITY_RECORD], kept, records.get(PINNED_RECORD) or {})
    return tables
