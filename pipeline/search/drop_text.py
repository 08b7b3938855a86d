"""A trial's metric drop as the console shows it, with its 95 % bootstrap interval
(:mod:`paretorch.pipeline.core.bootstrap`), and the end-of-search count of trials whose interval straddles the
allowed drop (``uncertain``: their verdict is within sampling noise)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from optuna.trial import FrozenTrial

from paretorch.pipeline.search.objectives import ATTR_UNCERTAIN

#: The word a trial line and the table carry when the drop's interval straddles the allowed drop.
UNCERTAIN = "uncertain"


def drop_text(drop: float, interval: tuple[float, float] = (math.nan, math.nan)) -> str:
    """``+0.0120 [+0.0050, +0.0190]``: the drop and its 95 % interval (the drop alone where none was computed)."""
    low, high = interval
    text = f"{drop:+.4f}"
    if math.isfinite(low) and math.isfinite(high):
        text += f" [{low:+.4f}, {high:+.4f}]"
    return text


def stored_interval(metrics: Mapping[str, float]) -> tuple[float, float]:
    """The drop's interval from a trial's stored metrics (NaN where the study measured none)."""
    return (float(metrics.get("metric_drop_ci_low", math.nan)), float(metrics.get("metric_drop_ci_high", math.nan)))


def uncertain_note(trials: Sequence[FrozenTrial]) -> str | None:
    """``3 trial(s) uncertain: ...``: how many trials have a drop interval straddling the allowed drop (None: none)."""
    numbers = [t.number for t in trials if t.user_attrs.get(ATTR_UNCERTAIN)]
    if not numbers:
        return None
    listed = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
    return (f"{len(numbers)} trial(s) {UNCERTAIN}: the 95 % interval of their metric drop straddles the allowed "
            f"drop, so feasible or not is within sampling noise of the evaluation data (trials {listed})")
