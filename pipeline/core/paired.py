"""Paired latency: a model timed in rounds alternating with the unoptimized model, in one process.

A lone latency is only as good as the moment it was taken: on a busy machine one trial measured
while another job ran looks several times slower than it is, and a speed-up that divides it by a
baseline measured minutes earlier is wrong either way. :func:`measure_paired` warms each side up once,
then times the baseline and the trial in rounds (each round a median of a few calls per side), so a
slow period slows both alike; the speed-up is the median of the per-round ratios, with a
distribution-free 95% interval (:mod:`paretorch.pipeline.core.noise`). How many rounds and calls: the study's
:class:`~paretorch.pipeline.core.latency.LatencySettings` (``--latency-budget``).

The order alternates: baseline first in even rounds, the trial first in odd ones (an even number of
rounds: A B | B A | A B ...). With a fixed order, whatever the first (or second) place in a round costs
(a colder cache, a clock ramping up) lands on one side only: the unoptimized model timed against itself
came out 1.005x with a 95% interval that excluded 1.0. :func:`~paretorch.pipeline.core.timing.time_rounds`
reverses the order on odd rounds for any number of functions (the front's re-measure), so each one's mean place is
the same.

Contention is checked per measurement: the interval's width, the 1-minute load average against the
cores this process may use, and on the CPU the process's CPU time against the wall time of its
rounds. A measurement whose interval is wider than :data:`MAX_CI_WIDTH` of its ratio goes on for more rounds
(up to :data:`RETRIES` more blocks), its interval always over all its rounds together; one that stays wide is
*unstable*, with the reason why. In a search a measurement stops as soon as its answer is known
(:class:`StopRule`: sequential stopping against the baseline and the front, and a cost cap).

The unoptimized model timed against itself (``self_pair``: the study's baseline trial, no stage under the baseline's
eager runtime) is 1.00x by construction, so its measurement checks the clock instead: it is never decided against
1.0, it stops (decided against the front, or settled) only once its 95 % interval includes 1.00x (more rounds while
it does not, within the same cap), and then reads 1.00x with that interval. One whose interval still excludes 1.00x
is *unstable* ("the unchanged model timed against itself: ..."): kept off the front with that reason, never a lead
with a speed-up of its own (under ``--latency-budget quick`` it read 1.21x [1.04, 1.88], decided faster than the
baseline after 6 rounds).

The rounds run on the timing service (:mod:`paretorch.pipeline.core.timing`): its alternating rounds
(:func:`~paretorch.pipeline.core.timing.alternate`), stopped by this module's rules, on a
:class:`~paretorch.pipeline.core.timing.RoundTimer` that warms the sides up and times one round (the budget's
:class:`~paretorch.pipeline.core.timing.DeviceTimer` on the device's one clock; tests inject fake timings).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from paretorch.pipeline.core.latency import LatencySettings
from paretorch.pipeline.core.noise import median_ci
from paretorch.pipeline.core.timing import CpuClock, RoundTimer, Timed, alternate, process_clock

#: A speed-up whose 95% interval is wider than this share of the speed-up is measured again.
MAX_CI_WIDTH = 0.20
#: How many more times an unstable measurement is taken before the trial is kept off the front.
RETRIES = 2
#: What the machine line says when the load kept feasible trials off the front.
UNSTABLE_ADVICE = (": their metric is within the drop, their timing never settled on this busy machine; re-run "
                   "later (the study resumes and re-times its front) or pass --latency-budget thorough")
#: On the CPU, a process that got less CPU time than this share of the wall time was waiting for a core.
BUSY_CPU_SHARE = 0.8


# --------------------------------------------------------------------------- the machine


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average (0 where the OS has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def free_cores(load: float | None = None, cores: int | None = None) -> int:
    """Cores not busy with other work: the usable cores minus the 1-minute load, at least 1."""
    cores = usable_cores() if cores is None else cores
    load = load_average() if load is None else load
    return max(1, min(cores, int(cores - load + 0.5)))


@dataclass(frozen=True)
class MachineLoad:
    """How busy the machine was during one measurement."""

    load: float
    cores: int
    #: Process CPU seconds per wall second of the measurement (CPU devices); None where not measured.
    cpu_share: float | None = None

    def describe(self) -> str:
        text = f"load {self.load:.1f} on {self.cores} core(s)"
        if self.cpu_share is not None:
            text += f", the process ran {self.cpu_share:.0%} of the wall time"
        return text


# --------------------------------------------------------------------------- one paired measurement


@dataclass(frozen=True)
class PairedLatency:
    """A trial timed in rounds with the baseline (alternating which goes first): medians, the speed-up and its
    interval."""

    baseline_ms: float
    trial_ms: float
    #: Median of the per-round ratios baseline / trial.
    speedup: float
    ci: tuple[float, float]
    rounds: int
    machine: MachineLoad
    #: Blocks of ``settings.rounds`` rounds it took (more than 1: measured longer, its interval was wide).
    attempts: int = 1
    #: Why the measurement is not trusted (``speed-up 95% CI ... over 30 rounds``); None when stable.
    unstable: str | None = None
    #: Why it stopped: ``settled`` (the interval narrow after the rounds), ``decided`` (its interval cleared every
    #: reference, :class:`StopRule`), ``cost cap``, ``round limit``.
    stopped: str = "settled"
    #: The trial's time in each round (ms): its own latency distribution, timed beside the baseline.
    trial_samples: tuple[float, ...] = ()

    @property
    def ci_width(self) -> float:
        """The interval's width as a share of the speed-up."""
        return (self.ci[1] - self.ci[0]) / self.speedup if self.speedup > 0 else float("inf")

    def metrics(self) -> dict[str, float]:
        """What a trial stores (and MLflow logs) about its paired measurement."""
        metrics = {"speedup": self.speedup, "speedup_ci_low": self.ci[0], "speedup_ci_high": self.ci[1],
                   "speedup_ci_width_pct": 100.0 * self.ci_width, "latency_ms_paired": self.trial_ms,
                   "baseline_latency_ms_paired": self.baseline_ms, "latency_rounds": float(self.rounds),
                   "latency_attempts": float(self.attempts), "machine_load": self.machine.load,
                   "machine_cores": float(self.machine.cores)}
        if self.machine.cpu_share is not None:
            metrics["machine_cpu_share"] = self.machine.cpu_share
        metrics["latency_stopped_early"] = float(self.stopped in ("decided", "cost cap"))
        return metrics


@dataclass(frozen=True)
class StopRule:
    """When a search's paired measurement may stop before its full rounds (sequential stopping).

    ``references`` are the speed-ups the search decides against: 1.0 (the baseline) and the current front's.
    After :attr:`first_look` rounds, and after every round from then on, the measurement stops once its
    interval at :attr:`confidence` (wider than the 95 % one: the repeated looks are paid for; with few rounds
    it is the full range of the ratios, e.g. 6 rounds hold the median with 96.9 %) clears every reference by
    more than :attr:`min_effect`: the trial is faster or slower than each with confidence, and more rounds
    cannot change a decision. A tie with a reference runs every round. :attr:`max_cost` caps what one trial's
    rounds cost, as a multiple of the baseline timed against itself for the study's rounds (the cost of a
    side's round: its calls, at least the round's seconds): a model many times slower than the baseline is
    decided in a few of its calls, not in hundreds."""

    references: tuple[float, ...] = (1.0,)
    min_effect: float = 0.03
    first_look: int = 6
    confidence: float = 0.99
    max_cost: float = 3.0

    def decided(self, interval: tuple[float, float]) -> bool:
        """Whether ``interval`` clears every reference (above or below it) by more than the minimum effect (never,
        with no reference)."""
        low, high = interval
        return bool(self.references) and all(low > ref * (1.0 + self.min_effect) or high * (1.0 + self.min_effect) < ref
                                             for ref in self.references)

    def without_baseline(self) -> StopRule:
        """The rule for the unoptimized model timed against itself: nothing to decide against 1.0."""
        return replace(self, references=tuple(ref for ref in self.references if ref != 1.0))


def _round_cost(ms: float, settings: LatencySettings) -> float:
    """What one side's round costs in ms: its calls, and at least the round's seconds."""
    return max(ms * settings.round_runs, 1000.0 * settings.round_seconds)


@dataclass(frozen=True)
class _Stopping:
    """Why a paired measurement stops after a round (None: another round), by :func:`measure_paired`'s rules."""

    settings: LatencySettings
    limit: int
    max_width: float
    stop: StopRule | None
    self_pair: bool

    def __call__(self, samples: Sequence[Sequence[float]]) -> str | None:
        base, mine = samples
        if self.stop is not None and self._past_cap(base, mine, self.stop):
            return "cost cap"
        if len(base) % 2 == 0:  # the rounds are judged in pairs, each side first in one of them
            verdict = self._verdict(_ratios(base, mine))
            if verdict is not None:
                return verdict
        return "round limit" if len(base) >= self.limit else None

    def _past_cap(self, base: Sequence[float], mine: Sequence[float], stop: StopRule) -> bool:
        """Whether another round like the last one would pass the cap: ``stop.max_cost`` baseline measurements, each
        priced on the first round's baseline."""
        costs = [_round_cost(b, self.settings) + _round_cost(m, self.settings) for b, m in zip(base, mine, strict=True)]
        return sum(costs) + costs[-1] > stop.max_cost * 2 * self.settings.rounds * _round_cost(base[0], self.settings)

    def _verdict(self, ratios: Sequence[float]) -> str | None:
        if self.self_pair and not _covers(median_ci(ratios), 1.0):  # the clock is not settled yet: go on
            return None
        stop = self.stop
        if stop is not None and len(ratios) >= stop.first_look and stop.decided(median_ci(ratios, stop.confidence)):
            return "decided"
        if len(ratios) >= self.settings.rounds and _width(ratios) <= self.max_width:
            return "settled"
        return None


def measure_paired(baseline: Timed, trial: Timed, timer: RoundTimer, settings: LatencySettings,
                   max_width: float = MAX_CI_WIDTH, retries: int = RETRIES,
                   cpu_clock: CpuClock | None = process_clock, stop: StopRule | None = None,
                   self_pair: bool = False) -> PairedLatency:
    """The trial's paired speed-up, each side warmed up once, then timed in rounds (the baseline first in even
    rounds, the trial in odd ones).

    It runs ``settings.rounds`` rounds; while the 95 % interval of all its rounds together is wider than
    ``max_width`` of the ratio, it goes on, up to ``retries`` more blocks of rounds (a busy machine is measured
    longer, never judged on its narrowest block); ``unstable`` says why when even all of them are too wide.
    ``stop`` (the search): it may stop earlier, once the answer is known (:class:`StopRule`), and its rounds
    never cost more than ``stop.max_cost`` baseline measurements (it stops before a round like its last would pass
    that cap: a model whose one round costs over half of it is timed in one round, MLX's CPU backend on MiniLM);
    :attr:`PairedLatency.stopped` says why. ``self_pair``: ``trial`` is the unoptimized model itself (see the module
    docstring): it stops only once its interval includes 1.0, and reads 1.00x or is unstable."""
    if stop is not None and self_pair:
        stop = stop.without_baseline()
    timer.warm_up((baseline, trial))
    before = cpu_clock() if cpu_clock is not None else None
    stopping = _Stopping(settings, settings.rounds * (retries + 1), max_width, stop, self_pair)
    (base, mine), stopped = alternate((baseline, trial), timer, stopping)
    measured = _paired(base, mine, before, cpu_clock)
    attempts = -(-len(base) // settings.rounds)
    measured = replace(measured, attempts=attempts, stopped=stopped)
    if self_pair:
        return _itself(measured, max_width)
    return _judged(measured, max_width)


def _judged(measured: PairedLatency, max_width: float) -> PairedLatency:
    """``measured`` as it is, or unstable when it neither decided nor settled and its interval stayed too wide."""
    if measured.stopped in ("decided", "settled") or measured.ci_width <= max_width:
        return measured
    why = (f"speed-up 95% CI [{measured.ci[0]:.2f}, {measured.ci[1]:.2f}] is {measured.ci_width:.0%} of "
           f"{measured.speedup:.2f}x (more than {max_width:.0%}) over {measured.rounds} rounds ({measured.stopped}); "
           f"{measured.machine.describe()}")
    return replace(measured, unstable=why)


def _itself(measured: PairedLatency, max_width: float) -> PairedLatency:
    """The unoptimized model timed against itself: 1.00x with its interval when that includes 1.0 (then judged as any
    measurement), else unstable: the clock did not settle."""
    if _covers(measured.ci, 1.0):
        return _judged(replace(measured, speedup=1.0), max_width)
    why = (f"the unchanged model timed against itself: {measured.speedup:.2f}x, 95% CI [{measured.ci[0]:.2f}, "
           f"{measured.ci[1]:.2f}] excludes 1.00x over {measured.rounds} rounds; timing not settled; "
           f"{measured.machine.describe()}")
    return replace(measured, unstable=why)


def _covers(interval: tuple[float, float], value: float) -> bool:
    return interval[0] <= value <= interval[1]


def _ratios(base: Sequence[float], mine: Sequence[float]) -> list[float]:
    return [b / t if t > 0 else 0.0 for b, t in zip(base, mine, strict=True)]


def _width(ratios: Sequence[float]) -> float:
    low, high = median_ci(ratios)
    middle = statistics.median(ratios)
    return (high - low) / middle if middle > 0 else float("inf")


def _paired(base: Sequence[float], mine: Sequence[float], before: tuple[float, float] | None,
            cpu_clock: CpuClock | None) -> PairedLatency:
    share = None
    if before is not None and cpu_clock is not None:
        wall, cpu = (after - start for after, start in zip(cpu_clock(), before, strict=True))
        share = cpu / wall if wall > 0 else None
    ratios = _ratios(base, mine)
    return PairedLatency(statistics.median(base), statistics.median(mine), statistics.median(ratios),
                         median_ci(ratios), len(base), MachineLoad(load_average(), usable_cores(), share),
                         trial_samples=tuple(mine))


# --------------------------------------------------------------------------- a study's machine


def noise_line(trials: Sequence[Mapping[str, float]], unstable: int) -> str | None:
    """One line on how noisy the machine was, from the trials' paired-measurement metrics
    (:meth:`PairedLatency.metrics`); None when no trial was paired."""
    paired = [m for m in trials if "speedup_ci_width_pct" in m]
    if not paired:
        return None
    load = statistics.median(m.get("machine_load", 0.0) for m in paired)
    cores = int(max(m.get("machine_cores", 1.0) for m in paired))
    width = statistics.median(m["speedup_ci_width_pct"] for m in paired)
    again = sum(1 for m in paired if m.get("latency_attempts", 1.0) > 1)
    shares = [m["machine_cpu_share"] for m in paired if "machine_cpu_share" in m]
    share = f", the process ran {statistics.median(shares):.0%} of the wall time" if shares else ""
    return (f"machine: load {load:.1f} on {cores} core(s) during the study{share}; median paired-ratio CI width "
            f"{width:.0f}% over {len(paired)} trial(s); {again} trial(s) re-measured, {unstable} kept off the front "
            f"(latency unstable)" + (UNSTABLE_ADVICE if unstable else ""))
