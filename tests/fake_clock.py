"""A simulated clock for tests of timing code: its time moves only when a test says so, so the timing service's rules
(:mod:`paretorch.pipeline.core.timing`) run on known times, with no sleeping and no timed assertion."""

from __future__ import annotations


class SimulatedClock:
    """A :class:`~paretorch.pipeline.core.timing.Clock` whose time moves by :meth:`advance` alone; it counts the
    regions it made and the waits it was asked for (what a test reads to know a path used it)."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.regions = 0
        self.waits = 0

    def advance(self, ms: float) -> None:
        self.now_ms += ms

    def region(self) -> SimulatedRegion:
        self.regions += 1
        return SimulatedRegion(self)

    def seconds(self) -> float:
        return self.now_ms / 1000.0

    def wait(self) -> None:
        self.waits += 1


class SimulatedRegion:
    """A region of a :class:`SimulatedClock`: from its start to :meth:`stop`, in simulated milliseconds."""

    def __init__(self, clock: SimulatedClock) -> None:
        self.clock = clock
        self.start = clock.now_ms
        self.end: float | None = None

    def stop(self) -> None:
        self.end = self.clock.now_ms

    def ms(self) -> float:
        assert self.end is not None, "read before stop()"
        return self.end - self.start
