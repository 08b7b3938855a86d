"""A study's latency measurements: each trial timed in rounds alternating with the unoptimized model.

One object per study holds what every paired measurement shares: the study's latency settings
(``--latency-budget``, :data:`paretorch.pipeline.core.latency.LATENCY_BUDGETS`: the same object the runner times
trials alone with), the baseline's prepared function (prepared once), the latency inputs per runtime
(chosen once, :func:`paretorch.pipeline.core.padding.latency_inputs`: the same samples for every side, each runtime
at its own length: the eager baseline at the batch's longest, a static-shape runtime in its bucket), the
round timer and the CPU clock (tests inject fakes for both). Every measurement here (a trial's probe before it is
scored, its paired rounds, the baseline alone, the front's re-time) runs on the timing service
(:mod:`paretorch.pipeline.core.timing`): the budget's :class:`~paretorch.pipeline.core.timing.DeviceTimer` on the
device's one clock, the one the machine probe reads.

What a side runs is the study's workload (:mod:`paretorch.pipeline.core.workload`, ``--workload``): by default
``serve``, raw inputs (strings for a text model) through the model to host outputs, a stream of batches, timed on the
host clock and read per batch; ``model`` times the model call alone on the latency batch already on the device.

A trial is timed from its run's own result (:meth:`StudyLatency.measure`): the function its evaluation
prepared and measured, else one prepared again from that run's configs and runtime, never a function
prepared for another recipe. The unoptimized model under :data:`BASELINE_RUNTIME` is the baseline itself: its pair
is a self-pair (:func:`~paretorch.pipeline.core.paired.measure_paired`'s ``self_pair``: 1.00x, or not settled).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from paretorch.pipeline.core.latency import LatencySettings, LatencyStats, latency_stats
from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.padding import latency_inputs
from paretorch.pipeline.core.paired import PairedLatency, StopRule, measure_paired
from paretorch.pipeline.core.runtimes.registry import get_runtime
from paretorch.pipeline.core.spec import Batch, ModelSpec, move_batch
from paretorch.pipeline.core.stage import StageConfig
from paretorch.pipeline.core.timing import (
    CpuClock,
    DeviceTimer,
    RoundTimer,
    Timed,
    host_seconds,
    process_clock,
    time_first_call,
    time_rounds,
)
from paretorch.pipeline.core.workload import Workload
from paretorch.pipeline.engine.run_result import RunResult
from paretorch.pipeline.engine.runner import Runner

#: The runtime the baseline is timed under: the unoptimized model under it is the baseline itself.
BASELINE_RUNTIME = DEFAULT_RUNTIME


@dataclass(frozen=True)
class TrialTiming:
    """A trial's paired measurement and its own latency statistics from the same rounds (one number per fact)."""

    paired: PairedLatency
    stats: LatencyStats


@dataclass(frozen=True)
class PerBatch:
    """A round timer whose milliseconds are per batch of a workload that runs ``batches`` of them a call."""

    timer: RoundTimer
    batches: int

    def warm_up(self, sides: Sequence[Timed]) -> None:
        self.timer.warm_up(sides)

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        return [ms / self.batches for ms in self.timer(sides)]


class WorkloadCall:
    """A model prepared for its runtime, run as the study's workload (``__wrapped__``: the model's function)."""

    def __init__(self, fn: Callable[..., Tensor], run: Callable[[], Tensor]) -> None:
        self.__wrapped__ = fn
        self._run = run

    def __call__(self) -> Tensor:
        return self._run()


class StudyLatency:
    """Paired latency of a study's trials against its baseline, at the objective batch size, on its workload."""

    def __init__(self, spec: ModelSpec, device: torch.device, batch_size: int,
                 runner: Callable[[], Runner], settings: LatencySettings, workload: Workload | None = None) -> None:
        self.spec = spec
        self.device = device
        self.batch_size = batch_size
        self.settings = settings
        #: What a side runs (None: the model call alone on the device batch, ``--workload model``).
        self.workload = workload
        self._runner = runner  # the study's runner, built on first use
        #: Warms up and times one round (:mod:`paretorch.pipeline.core.paired`); tests inject a fake clock here. A
        #: workload ends on the host, so it is timed on the host clock.
        self.timer: RoundTimer = DeviceTimer(device if workload is None else torch.device("cpu"), settings)
        #: Process CPU time against wall time during a measurement: on the CPU only.
        self.cpu_clock: CpuClock | None = process_clock if device.type == "cpu" else None
        self._baseline: Callable[..., Tensor] | None = None
        self._inputs: dict[str, Batch] = {}
        #: Seconds spent in paired measurements (:meth:`measure`): evaluation time, in the run's time split.
        self.seconds = 0.0

    def inputs(self, runtime: str = DEFAULT_RUNTIME) -> Batch:
        """The inputs latency is timed on for ``runtime``, on the device (chosen once per runtime)."""
        if runtime not in self._inputs:
            chosen = latency_inputs(self.spec, self.batch_size, runtime)[0]
            self._inputs[runtime] = move_batch(chosen, self.device)
        return self._inputs[runtime]

    def function(self, configs: Mapping[str, StageConfig | None], runtime: str) -> Callable[..., Tensor]:
        """A trial's model (from the runner's cache when it is there) prepared for its runtime."""
        return self._runner().prepare(configs, runtime)

    def measured(self, result: RunResult) -> Callable[..., Tensor]:
        """The objective's model of ``result``: the function its evaluation prepared and measured (a compiled
        model is not compiled twice), else (a cached evaluation) prepared again from the run's own configs."""
        if result.prepared is not None:
            return result.prepared
        return self.function(result.configs, result.runtime)

    def baseline(self) -> Callable[..., Tensor]:
        """The unoptimized model, eager, prepared once for the study."""
        if self._baseline is None:
            self._baseline = self.function({}, BASELINE_RUNTIME)
        return self._baseline

    def timed(self, fn: Callable[..., Tensor], runtime: str) -> Timed:
        """``fn`` (a model prepared for ``runtime``) as one side of a measurement: the study's workload (no inputs:
        a call runs it whole), else the model and the device batch ``runtime`` is timed on."""
        if self.workload is None:
            return fn, self.inputs(runtime)
        run = self.workload.timed(fn, self.device, self.spec.encode_text, get_runtime(runtime).static_shapes)
        return WorkloadCall(fn, run), ()

    @property
    def round_timer(self) -> RoundTimer:
        """:attr:`timer`, its milliseconds per batch of the workload."""
        return self.timer if self.workload is None else PerBatch(self.timer, self.workload.batches)

    def side(self, configs: Mapping[str, StageConfig | None], runtime: str) -> Timed:
        """A trial's prepared model as a side (:meth:`timed`)."""
        return self.timed(self.function(configs, runtime), runtime)

    def baseline_side(self) -> Timed:
        """The unoptimized model, eager, as a side."""
        return self.timed(self.baseline(), BASELINE_RUNTIME)

    def measure(self, result: RunResult) -> PairedLatency:
        """The trial that ``result`` evaluated (:meth:`measured`) timed in rounds alternating with the baseline;
        its seconds add to :attr:`seconds`."""
        start = host_seconds()
        try:
            return self.pair(self.measured(result), result.runtime)
        finally:
            self.seconds += host_seconds() - start

    def pair(self, fn: Callable[..., Tensor], runtime: str, stop: StopRule | None = None,
             itself: bool = False) -> PairedLatency:
        """``fn`` (a model already prepared for ``runtime``) timed in rounds alternating with the baseline, on
        the inputs ``runtime`` is timed on (the bench's rows: the runner's own measured function); ``stop``: it may
        stop once its answer is known (:class:`~paretorch.pipeline.core.paired.StopRule`); ``itself``: ``fn`` is the
        unoptimized model under :data:`BASELINE_RUNTIME` (a self-pair: 1.00x, or not settled)."""
        return measure_paired(self.baseline_side(), self.timed(fn, runtime), self.round_timer, self.settings,
                              cpu_clock=self.cpu_clock, stop=stop, self_pair=itself)

    def probe(self, fn: Callable[..., Tensor], runtime: str, stop: StopRule, itself: bool = False) -> TrialTiming:
        """A trial's latency before its evaluation (:mod:`paretorch.pipeline.search.probe`): its first call timed apart
        (a compiled runtime compiles there), then paired with the baseline under ``stop`` (``itself``: see
        :meth:`pair`). Its seconds add to :attr:`seconds`."""
        start = host_seconds()
        try:
            first_call_ms = self.first_call(*self.timed(fn, runtime))
            paired = self.pair(fn, runtime, stop, itself)
        finally:
            self.seconds += host_seconds() - start
        samples = paired.trial_samples or (paired.trial_ms,)
        return TrialTiming(paired, latency_stats(samples, self.batch_size, first_call_ms))

    def first_call(self, fn: Callable[..., object], inputs: Batch) -> float:
        """The first call's milliseconds (a workload's: its whole first call; tests replace the clock: 0 with a
        fake timer)."""
        if not isinstance(self.timer, DeviceTimer):
            return 0.0
        return time_first_call(fn, inputs, self.timer.device)

    def describe(self, baseline_ms: float | None = None, model_call_ms: float | None = None) -> str:
        """``latency timed on serve: 4 batches of 32 strings ..., paired with the baseline (12.3 ms a batch; the model
        call alone 10.1 ms, column "model call")``: what the objective times, said once at the start and under the
        table."""
        if self.workload is None:
            scale = f" ({baseline_ms:.3f} ms)" if baseline_ms is not None else ""
            return f"latency timed on the model call alone, on the latency batch on the device{scale} (--workload)"
        scale = ""
        if baseline_ms is not None:
            call = f"; the model call alone {model_call_ms:.3f} ms" if model_call_ms is not None else ""
            scale = f" (the baseline {baseline_ms:.3f} ms a batch{call})"
        return (f"latency timed on {self.workload.describe()}, paired with the baseline{scale}; the model call alone "
                f"is the column 'model call' (--workload)")

    def baseline_alone(self) -> LatencyStats:
        """The baseline's own latency on the workload, per batch, timed alone (the study's latency scale)."""
        fn, inputs = self.baseline_side()
        self.timer.warm_up([(fn, inputs)])
        samples = [self.round_timer([(fn, inputs)])[0] for _ in range(self.settings.rounds)]
        return latency_stats(samples, self.batch_size, 0.0)

    def together(self, sides: Sequence[Timed]) -> list[list[float]]:
        """Several models timed in the same rounds (each warmed up once, the order reversed every other
        round): per side, its median in each round."""
        self.timer.warm_up(sides)
        return time_rounds(sides, self.round_timer, self.settings.rounds)
