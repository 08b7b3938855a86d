"""The runtime sweep's own index: which runtimes each resolved stage list has run under."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.search.record import TrialRecord


@dataclass
class RuntimeSweepIndex:
    """For the runtime sweep: which runtimes each resolved stage list has run under, and the
    fastest feasible latency so far."""

    runtimes: dict[str, set[str]] = field(default_factory=dict)
    fastest: float = float("inf")
    seen: set[int] = field(default_factory=set)

    def add(self, record: TrialRecord, latency: float | None) -> float | None:
        """Index ``record`` (once); returns ``latency`` for the caller's convenience."""
        if record.number in self.seen:
            return latency
        self.seen.add(record.number)
        if record.stages_key is not None:
            self.runtimes.setdefault(record.stages_key, set()).add(record.runtime)
        if latency is not None:
            self.fastest = min(self.fastest, latency)
        return latency
