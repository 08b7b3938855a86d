"""The one timing service: one clock per device, and the rules every timed path follows.

Every latency paretorch reports is read here, on one clock per device, under one set of rules:

* **The clock** (:func:`clock_for`: one object per device, the only code that reads a clock or waits for a device):
  device events on an accelerator (``torch.Event`` recorded in the device's queue, read once the work is done, so a
  loop of timed regions has no host sync inside; ``torch.accelerator`` waits for the device: CUDA and MPS share one
  path), ``perf_counter_ns`` on the CPU. This module is the one place that decides which. Host seconds
  (:func:`host_seconds`: a loop's minimum time, a deadline, a measurement's wall-time split) and the process's CPU
  time (:func:`process_clock`) come from here too. A test swaps a
  device's clock (:func:`use_clock`): every path on that device then reads the swapped one.
* **The rules**: untimed warm-up calls (:func:`warm_up`), timed calls until a count and a time are both reached
  (:func:`time_calls`), the first call timed apart (:func:`time_first_call`: a compiled runtime compiles there), a
  block of calls timed as one region (:func:`time_block`), and rounds that alternate which side goes first
  (:func:`round_order`, :func:`alternate`, :func:`time_rounds`) through a :class:`RoundTimer`: the budget's
  (:class:`DeviceTimer`: ``--latency-budget``, :data:`paretorch.pipeline.core.latency.LATENCY_BUDGETS`) or blocks
  (:class:`BlockTimer`: the machine probe's matmul products).
* **The two operations** built on them: a callable timed alone (:func:`measure_latency`: percentiles) and timed
  paired with a baseline in alternating rounds (:func:`paretorch.pipeline.core.paired.measure_paired`: the median of
  the per-round ratios with its interval, stopped by a :class:`~paretorch.pipeline.core.paired.StopRule`).

Who times through it: the machine probe (:func:`paretorch.pipeline.core.machine_probe.paired_gain`, and the CPU bf16
probe of the capability table), a trial's paired timing and the front's re-time
(:class:`paretorch.pipeline.search.study_latency.StudyLatency`), ``evaluate`` / ``apply`` / a trial's evaluation
(:func:`paretorch.pipeline.core.evaluate.evaluate_model`), the export stages' files (the user's budget and batch
through :class:`~paretorch.pipeline.core.stage_context.StageContext`), and the bench (``experiments/bench``).
``tests/pipeline/core/test_timing.py`` checks that nothing else reads a clock for a latency.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from paretorch.pipeline.core.latency import LatencySettings, LatencyStats, batch_size_of, latency_stats
from paretorch.pipeline.core.spec import Batch

#: One side of a timed comparison: a prepared function and the inputs it is timed on (each runtime its own:
#: a static-shape runtime pays for its length bucket, :func:`paretorch.pipeline.core.padding.latency_inputs`).
Timed = tuple[Callable[..., object], Batch]
#: ``() -> (wall seconds, process CPU seconds)``; None where CPU time says nothing (an accelerator).
CpuClock = Callable[[], tuple[float, float]]


# --------------------------------------------------------------------------- the clock


class Region(Protocol):
    """One timed region, started when its clock made it."""

    def stop(self) -> None:
        """End the region (records; does not wait for the device)."""

    def ms(self) -> float:
        """The region's milliseconds (waits for the device until the region's end where it must)."""


class Clock(Protocol):
    """A device's clock: timed regions, host seconds, and a wait for the device's queued work."""

    def region(self) -> Region:
        """A region started now."""

    def seconds(self) -> float:
        """Host seconds (for a loop's minimum time and deadlines)."""

    def wait(self) -> None:
        """Wait for the device's queued work."""


class _HostRegion:
    def __init__(self) -> None:
        self._start = time.perf_counter_ns()
        self._stop = self._start

    def stop(self) -> None:
        self._stop = time.perf_counter_ns()

    def ms(self) -> float:
        return (self._stop - self._start) / 1e6


class HostClock:
    """The CPU's clock: ``perf_counter_ns``; nothing to wait for."""

    def region(self) -> Region:
        return _HostRegion()

    def seconds(self) -> float:
        return host_seconds()

    def wait(self) -> None:
        return None


class _EventRegion:
    def __init__(self, device: torch.device) -> None:
        self._start = torch.Event(device=device, enable_timing=True)
        self._stop = torch.Event(device=device, enable_timing=True)
        self._start.record()

    def stop(self) -> None:
        self._stop.record()

    def ms(self) -> float:
        self._stop.synchronize()
        return float(self._start.elapsed_time(self._stop))


class EventClock:
    """An accelerator's clock: events recorded in its queue (``torch.Event``), ``torch.accelerator`` to wait."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def region(self) -> Region:
        return _EventRegion(self.device)

    def seconds(self) -> float:
        return host_seconds()

    def wait(self) -> None:
        torch.accelerator.synchronize(self.device)


_CLOCKS: dict[torch.device, Clock] = {}


def clock_for(device: torch.device) -> Clock:
    """The one clock of ``device`` (made on first use): events on an accelerator, the host clock on the CPU."""
    if device not in _CLOCKS:
        _CLOCKS[device] = HostClock() if device.type == "cpu" else EventClock(device)
    return _CLOCKS[device]


@contextmanager
def use_clock(device: torch.device, clock: Clock) -> Iterator[Clock]:
    """``clock`` as ``device``'s clock while the block runs (tests: a fake clock every path on the device reads)."""
    before = _CLOCKS.get(device)
    _CLOCKS[device] = clock
    try:
        yield clock
    finally:
        if before is None:
            _CLOCKS.pop(device, None)
        else:
            _CLOCKS[device] = before


def host_seconds() -> float:
    """The host's wall clock in seconds (``perf_counter``): a loop's minimum time, a deadline, a wall-time split."""
    return time.perf_counter()


def process_clock() -> tuple[float, float]:
    """Host wall seconds and this process's CPU seconds (a CPU measurement's share of a core: :data:`CpuClock`)."""
    return host_seconds(), time.process_time()


# --------------------------------------------------------------------------- the rules


def warm_up(fn: Callable[..., object], inputs: Batch, device: torch.device, runs: int,
            max_seconds: float = math.inf) -> None:
    """Call ``fn(*inputs)`` ``runs`` times, untimed (fewer once the calls have run ``max_seconds``: at least one),
    and wait for the device."""
    clock = clock_for(device)
    with torch.no_grad():
        start = clock.seconds()
        for _ in range(runs):
            fn(*inputs)
            if clock.seconds() - start >= max_seconds:
                break
    clock.wait()


def time_calls(fn: Callable[..., object], inputs: Batch, device: torch.device, min_runs: int,
               min_seconds: float = 0.0, max_runs: int = 2000, max_seconds: float = math.inf) -> list[float]:
    """Milliseconds of each call of ``fn(*inputs)``, until both ``min_runs`` and ``min_seconds`` are
    reached (at most ``max_runs``; none after the calls have run ``max_seconds`` of host time: at least one).
    No warm-up; the loop records timed regions and never waits for the device inside; they are read once at the end."""
    clock = clock_for(device)
    regions: list[Region] = []
    with torch.no_grad():
        loop_start = clock.seconds()
        while len(regions) < max_runs and (len(regions) < min_runs or clock.seconds() - loop_start < min_seconds):
            if regions and clock.seconds() - loop_start >= max_seconds:
                break
            region = clock.region()
            fn(*inputs)
            region.stop()
            regions.append(region)
        clock.wait()
    return [region.ms() for region in regions]


def time_first_call(fn: Callable[..., object], inputs: Batch, device: torch.device) -> float:
    """Milliseconds of one call, timed apart (a compiled runtime compiles there)."""
    return time_block(fn, inputs, device, 1)


def time_block(fn: Callable[..., object], inputs: Batch, device: torch.device, calls: int) -> float:
    """Milliseconds of ``calls`` consecutive calls of ``fn(*inputs)`` timed as one region, the device waited for."""
    clock = clock_for(device)
    with torch.no_grad():
        region = clock.region()
        for _ in range(calls):
            fn(*inputs)
        region.stop()
        elapsed = region.ms()
    clock.wait()
    return elapsed


def measure_latency(fn: Callable[..., object], inputs: Batch, device: torch.device,
                    settings: LatencySettings) -> LatencyStats:
    """Latency of ``fn(*inputs)`` timed alone: the first call (timed apart: a compiled runtime compiles
    there), ``warmup_runs`` calls, then timed runs until both ``min_runs`` and ``min_seconds``."""
    first_call_ms = time_first_call(fn, inputs, device)
    warm_up(fn, inputs, device, settings.warmup_runs)
    times = time_calls(fn, inputs, device, settings.min_runs, settings.min_seconds, settings.max_runs)
    return latency_stats(times, batch_size_of(inputs), first_call_ms)


# --------------------------------------------------------------------------- rounds


class RoundTimer(Protocol):
    """Times rounds of sides: :meth:`warm_up` once per measurement, then one call per round."""

    def warm_up(self, sides: Sequence[Timed]) -> None:
        """Each side's untimed warm-up calls."""

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        """One round: each side in the given order, its time in the round, in ms."""


@dataclass(frozen=True)
class DeviceTimer:
    """The budget's round timer: ``settings.warmup_runs`` calls per side per measurement, then per round each side's
    median of ``settings.round_runs`` calls (at least ``settings.round_seconds``), on ``device``'s clock."""

    device: torch.device
    settings: LatencySettings

    def warm_up(self, sides: Sequence[Timed]) -> None:
        for fn, inputs in sides:
            warm_up(fn, inputs, self.device, self.settings.warmup_runs, self.settings.call_cap_seconds)

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        settings = self.settings
        return [statistics.median(time_calls(fn, inputs, self.device, settings.round_runs, settings.round_seconds,
                                             settings.max_runs, settings.call_cap_seconds)) for fn, inputs in sides]


@dataclass(frozen=True)
class BlockTimer:
    """A round timer of blocks: ``warm_calls`` untimed calls per side per measurement, then per round each side's
    ``calls`` consecutive calls as one region on ``device``'s clock (the machine probe: a product fast enough that
    one call times the launch, not the work)."""

    device: torch.device
    calls: int
    warm_calls: int

    def warm_up(self, sides: Sequence[Timed]) -> None:
        for fn, inputs in sides:
            warm_up(fn, inputs, self.device, self.warm_calls)

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        return [time_block(fn, inputs, self.device, self.calls) for fn, inputs in sides]


def round_order(count: int, index: int) -> list[int]:
    """The order of ``count`` sides in round ``index``: as given in even rounds, reversed in odd ones."""
    order = list(range(count))
    return order[::-1] if index % 2 else order


#: After each round, given each side's times so far: why the rounds stop (None: another round).
Done = Callable[[Sequence[Sequence[float]]], str | None]


def alternate(sides: Sequence[Timed], timer: RoundTimer, done: Done) -> tuple[list[list[float]], str]:
    """Rounds of ``sides`` on ``timer`` (no warm-up: the caller's), the order reversed every other round
    (:func:`round_order`: each side's mean place is the same), until ``done`` names why they stop (at least one
    round): per side its time in each round, and that reason."""
    samples: list[list[float]] = [[] for _ in sides]
    with torch.no_grad():
        while True:
            order = round_order(len(sides), len(samples[0]))
            for position, value in zip(order, timer([sides[i] for i in order]), strict=True):
                samples[position].append(value)
            reason = done(samples)
            if reason is not None:
                return samples, reason


def time_rounds(sides: Sequence[Timed], timer: RoundTimer, rounds: int) -> list[list[float]]:
    """Per side, its time in each of ``rounds`` rounds (at least one; the order reversed every other round)."""
    return alternate(sides, timer, lambda samples: "rounds" if len(samples[0]) >= rounds else None)[0]
