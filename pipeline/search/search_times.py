"""Where a search's wall time went: the runner's categories (model load, stages, evaluation, exports, runtime
sessions) and the rest (search, tracking and I/O), as the end of a search prints it."""

from __future__ import annotations

from dataclasses import dataclass, field

from paretorch.pipeline.engine.runner import TIME_CATEGORIES


@dataclass
class SearchTimes:
    """Where the wall time went (seconds)."""

    wall: float = 0.0
    by_category: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_CATEGORIES, 0.0))

    @property
    def work(self) -> float:
        return sum(self.by_category.values())

    @property
    def other(self) -> float:
        return max(0.0, self.wall - self.work)

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in self.by_category.items())
        share = 100.0 * self.other / self.wall if self.wall else 0.0
        return f"{self.wall:.1f} s in all: {parts}; search, tracking and I/O {self.other:.1f} s ({share:.1f}%)"
