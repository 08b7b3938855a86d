"""The allowed drop of the task metric (``--max-drop``): absolute (``0.01``) or relative to the baseline (``1%``).

``--max-drop 0.01`` allows the metric to get 0.01 worse than the unoptimized model's;
``--max-drop 1%`` allows 1 % of the unoptimized model's value (0.0098 of an accuracy of
0.9822). The default is relative, :data:`DEFAULT_MAX_DROP` (1 %), unless the search config
(``pipeline/defaults/search.yaml`` or ``--search-config``) or the flag sets its own. For a
metric where lower is better (a loss, a perplexity) the drop is measured upward.
:class:`paretorch.pipeline.search.objectives.Objectives` owns the value and gives every trial its verdict;
nothing else compares drops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from paretorch.pipeline.core.errors import ConfigError

FLAG = "--max-drop"
DropKind = Literal["absolute", "relative"]
_WHAT_TO_GIVE = "give an absolute drop of the metric (e.g. 0.01) or a percentage of the baseline metric (e.g. 1%)"


@dataclass(frozen=True)
class AllowedDrop:
    """How much worse than the baseline a trial's metric may be.

    ``amount``: in the metric's units when absolute; a fraction of the baseline metric
    when relative (0.01 for ``1%``)."""

    kind: DropKind
    amount: float

    @classmethod
    def parse(cls, value: str | float | AllowedDrop) -> AllowedDrop:
        """``"1%"`` -> relative 0.01; ``"0.01"`` or ``0.01`` -> absolute 0.01. One :class:`ConfigError`
        naming ``--max-drop`` for anything else."""
        if isinstance(value, AllowedDrop):
            return value
        if isinstance(value, bool):
            raise _error(value, f"not a number; {_WHAT_TO_GIVE}")
        text = str(value).strip()
        if text.endswith("%"):
            percent = _number(text, text[:-1], "not a percentage; write one number and one % sign (e.g. 1%)")
            if not 0.0 <= percent <= 100.0:
                raise _error(text, "a relative drop must be between 0% and 100% of the baseline metric (e.g. 1%)")
            return cls("relative", percent / 100.0 + 0.0)
        amount = _number(text, text, f"not a number; {_WHAT_TO_GIVE}")
        if amount < 0.0:
            raise _error(text, f"a drop cannot be negative; {_WHAT_TO_GIVE}")
        return cls("absolute", amount + 0.0)  # -0 -> 0

    @property
    def percent(self) -> float:
        """A relative drop in percent (1.0 for ``1%``)."""
        return self.amount * 100.0

    def given(self) -> str:
        """The value as a user writes it: ``1%`` or ``0.01``."""
        return f"{self.percent:g}%" if self.kind == "relative" else f"{self.amount:g}"

    def to_json(self) -> float | str:
        """What a search config stores (and the study's name hashes): the float of an absolute drop, exactly as
        before relative drops existed (so existing studies keep their names), ``"1%"`` for a relative one."""
        return self.given() if self.kind == "relative" else self.amount

    def threshold(self, baseline_value: float) -> float:
        """The absolute drop allowed against a baseline metric of ``baseline_value``."""
        if self.kind == "absolute":
            return self.amount
        if not math.isfinite(baseline_value) or baseline_value <= 0.0:
            given = f"{self.given()} (the default)" if self == DEFAULT_MAX_DROP else self.given()
            raise _error(given, f"a relative drop needs a positive baseline metric, and the baseline's is "
                                f"{baseline_value:g}; give an absolute drop instead (e.g. {FLAG} 0.01)")
        return self.amount * baseline_value

    def describe(self, baseline_value: float | None = None) -> str:
        """``0.01 absolute``; ``1% of the baseline 0.9822 = 0.009822 absolute`` (without a baseline:
        ``1% of the baseline``)."""
        if self.kind == "absolute":
            return f"{self.given()} absolute"
        if baseline_value is None:
            return f"{self.given()} of the baseline"
        return f"{self.given()} of the baseline {baseline_value:.4g} = {self.threshold(baseline_value):.4g} absolute"


#: The allowed drop when neither the command line nor the search config sets one: 1 % of the baseline metric,
#: which means the same on every metric (0.0098 of an accuracy of 0.98, 0.44 of a 0-100 score of 44.3).
DEFAULT_MAX_DROP = AllowedDrop("relative", 0.01)


def _number(given: str, text: str, problem: str) -> float:
    """``text`` as a finite float, else the error for ``given``."""
    try:
        number = float(text)
    except ValueError:
        raise _error(given, problem) from None
    if not math.isfinite(number):
        raise _error(given, problem)
    return number


def _error(given: object, problem: str) -> ConfigError:
    return ConfigError(f"{FLAG} {given}: {problem}")
