"""A study's latency measurements: each trial timed in rounds alternating with the unoptimized model.

One object per study holds what every paired measurement shares: the study's latency settings
(``--latency-budget``, :data:`pipeline.core.latency.LATENCY_BUDGETS`: the same object the runner times
trials alone with), the baseline's prepared function (prepared once), the latency inputs per runtime
(chosen once, :func:`pipeline.core.padding.latency_inputs`: the same samples for every side, each runtime
at its own length: the eager baseline at the batch's longest, a static-shape runtime in its bucket), the
round timer and the CPU clock (tests inject fakes for both).

A trial is timed from its run's own result (:meth:`StudyLatency.measure`): the function its evaluation
prepared and measured, else one prepared again from that run's configs and runtime, never a function
prepared for another recipe. The unoptimized model under :data:`BASELINE_RUNTIME` is the baseline itself: its pair
is a self-pair (:func:`~pipeline.core.paired.measure_paired`'s ``self_pair``: 1.00x, or not settled).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from pipeline.core.latency import LatencySettings, LatencyStats, batch_size_of, latency_stats, time_first_call
from pipeline.core.padding import latency_inputs
from pipeline.core.paired import (
    CpuClock,
    DeviceTimer,
    PairedLatency,
    RoundTimer,
    StopRule,
    Timed,
    measure_paired,
    process_clock,
    time_rounds,
)
from pipeline.core.spec import Batch, ModelSpec, move_batch
from pipeline.core.stage import StageConfig
from pipeline.engine.run_result import RunResult
from pipeline.engine.runner import Runner

#: The runtime the baseline is timed under: the unoptimized model under it is the baseline itself.
BASELINE_RUNTIME = "eager"


@dataclass(frozen=True)
class TrialTiming:
    """A trial's paired measurement and its own latency statistics from the same rounds (one number per fact)."""

    paired: PairedLatency
    stats: LatencyStats


class StudyLatency:
    """Paired latency of a study's trials against its baseline, at the objective batch size."""

    def __init__(self, spec: ModelSpec, device: torch.device, batch_size: int,
                 runner: Callable[[], Runner], settings: LatencySettings) -> None:
        self.spec = spec
        self.device = device
        self.batch_size = batch_size
        self.settings = settings
        self._runner = runner  # the study's runner, built on first use
        #: Warms up and times one round (:mod:`pipeline.core.paired`); tests inject a fake clock here.
        self.timer: RoundTimer = DeviceTimer(device, settings)
        #: Process CPU time against wall time during a measurement: on the CPU only.
        self.cpu_clock: CpuClock | None = process_clock if device.type == "cpu" else None
        self._baseline: Callable[..., Tensor] | None = None
        self._inputs: dict[str, Batch] = {}
        #: Seconds spent in paired measurements (:meth:`measure`): evaluation time, in the run's time split.
        self.seconds = 0.0

    def inputs(self, runtime: str = "eager") -> Batch:
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

    def side(self, configs: Mapping[str, StageConfig | None], runtime: str) -> Timed:
        """A trial's prepared model and the inputs its runtime is timed on."""
        return self.function(configs, runtime), self.inputs(runtime)

    def baseline_side(self) -> Timed:
        """The unoptimized model, eager, and its inputs."""
        return self.baseline(), self.inputs(BASELINE_RUNTIME)

    def measure(self, result: RunResult) -> PairedLatency:
        """The trial that ``result`` evaluated (:meth:`measured`) timed in rounds alternating with the baseline;
        its seconds add to :attr:`seconds`."""
        start = time.perf_counter()
        try:
            return self.pair(self.measured(result), result.runtime)
        finally:
            self.seconds += time.perf_counter() - start

    def pair(self, fn: Callable[..., Tensor], runtime: str, stop: StopRule | None = None,
             itself: bool = False) -> PairedLatency:
        """``fn`` (a model already prepared for ``runtime``) timed in rounds alternating with the baseline, on
        the inputs ``runtime`` is timed on (the bench's rows: the runner's own measured function); ``stop``: it may
        stop once its answer is known (:class:`~pipeline.core.paired.StopRule`); ``itself``: ``fn`` is the unoptimized
        model under :data:`BASELINE_RUNTIME` (a self-pair: 1.00x, or not settled)."""
        baseline = self.baseline_side()
        return measure_paired(baseline, (fn, self.inputs(runtime)), self.timer, self.settings,
                              cpu_clock=self.cpu_clock, stop=stop, self_pair=itself)

    def probe(self, fn: Callable[..., Tensor], runtime: str, stop: StopRule, itself: bool = False) -> TrialTiming:
        """A trial's latency before its evaluation (:mod:`pipeline.search.probe`): its first call timed apart (a
        compiled runtime compiles there), then paired with the baseline under ``stop`` (``itself``: see :meth:`pair`).
        Its seconds add to :attr:`seconds`."""
        start = time.perf_counter()
        try:
            inputs = self.inputs(runtime)
            first_call_ms = self.first_call(fn, inputs)
            paired = self.pair(fn, runtime, stop, itself)
        finally:
            self.seconds += time.perf_counter() - start
        samples = paired.trial_samples or (paired.trial_ms,)
        return TrialTiming(paired, latency_stats(samples, batch_size_of(inputs), first_call_ms))

    def first_call(self, fn: Callable[..., Tensor], inputs: Batch) -> float:
        """The first call's milliseconds (tests replace the clock: 0 with a fake timer)."""
        if not isinstance(self.timer, DeviceTimer):
            return 0.0
        return time_first_call(fn, inputs, self.device)

    def together(self, sides: Sequence[Timed]) -> list[list[float]]:
        """Several models timed in the same rounds (each warmed up once, the order reversed every other
        round): per side, its median in each round."""
        self.timer.warm_up(sides)
        return time_rounds(sides, self.timer, self.settings.rounds)
