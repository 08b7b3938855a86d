"""Why a recipe costs accuracy: per-layer tables built from what stages recorded.

AMP calibration records ``amp.sensitivity`` ({layer: output error with that layer alone in the
reduced dtype}) and ``amp.pinned`` ({layer: why it stays float32}); the resolved config names
the layers kept in float32. :func:`sensitivity_tables` turns them into one CSV per node,
logged as an artifact of the trial's run (which layers cost accuracy, which stayed in float).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from typing import Any

from paretorch.pipeline.core.stage import StageConfig

SENSITIVITY_RECORD = "amp.sensitivity"
PINNED_RECORD = "amp.pinned"


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
