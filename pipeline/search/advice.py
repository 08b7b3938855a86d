"""What to try when no compression fit: the end of a run whose only feasible result is the unoptimized model.

A front of the baseline alone is an answer ("nothing here keeps the metric within the drop"), and the run says so
in those words, then what would change it, each from the study's own trials and settings:

* the smallest drop a compressed recipe reached, which recipe, and the ``MAX_DROP`` that would admit it;
* labelled data (``--eval-data``), when the metric is fidelity to the unoptimized model: a user's task metric
  usually tolerates more than output fidelity does;
* more trials, when fewer ran than the search space holds, and the stages the config disabled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from optuna.trial import FrozenTrial, TrialState

from paretorch.pipeline.search.objectives import (
    ATTR_FEASIBLE,
    ATTR_METRICS,
    ATTR_RECIPE_LINE,
    ATTR_SEED,
    BASELINE_SEED,
)

#: A suggested ``MAX_DROP`` is the smallest drop reached, rounded up to this many significant digits.
SUGGESTED_DIGITS = 2


@dataclass(frozen=True)
class RunSettings:
    """What the advice reads of the run besides its trials."""

    #: The allowed drop as the user reads it (``1% of the baseline 0.9924 = 0.009924 absolute``).
    allowed: str
    #: The metric reads the user's labels (``--eval-data``, a built-in task), not fidelity to the model.
    labelled: bool
    #: The study's total of trials asked for (``--trials``).
    trials: int
    #: Stages the search config disabled (``--disable``).
    disabled: tuple[str, ...] = ()


def _compressed(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get(ATTR_SEED) != BASELINE_SEED
            and "metric_drop" in t.user_attrs.get(ATTR_METRICS, {})]


def suggested_max_drop(drop: float) -> float:
    """``drop`` rounded up to :data:`SUGGESTED_DIGITS` significant digits (a limit that admits it)."""
    if drop <= 0:
        return 0.0
    exponent = math.floor(math.log10(drop)) - SUGGESTED_DIGITS + 1
    return round(math.ceil(drop / 10**exponent - 1e-9) * 10**exponent, -exponent)


def no_compression_advice(trials: Sequence[FrozenTrial], settings: RunSettings) -> list[str]:
    """The lines that end a run in which no compressed recipe was feasible (none when one was, or when no
    compressed recipe completed at all: then nothing was learnt about the drop)."""
    compressed = _compressed(trials)
    if not compressed or any(t.user_attrs.get(ATTR_FEASIBLE) for t in compressed):
        return []
    closest = min(compressed, key=lambda t: float(t.user_attrs[ATTR_METRICS]["metric_drop"]))
    drop = float(closest.user_attrs[ATTR_METRICS]["metric_drop"])
    recipe = closest.user_attrs.get(ATTR_RECIPE_LINE, f"trial {closest.number}")
    lines = [f"no compression fit the allowed drop ({settings.allowed}): the front is the unoptimized model alone",
             f"  closest: {recipe} (trial {closest.number}) dropped the metric by {drop:.4g}; "
             f"MAX_DROP={suggested_max_drop(drop):g} would admit it"]
    if not settings.labelled:
        lines.append("  labelled data: --eval-data FILE judges recipes by your task's metric, which usually allows "
                     "more than fidelity to the unoptimized outputs")
    ran = sum(1 for t in trials if t.state.is_finished())
    more = [f"more trials (TRIALS={2 * max(settings.trials, ran)}; {ran} ran)"]
    if settings.disabled:
        more.append(f"the stages this search disabled ({', '.join(settings.disabled)})")
    lines.append("  or try " + ", or ".join(more))
    return lines
