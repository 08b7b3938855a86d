"""The distillation loop: seeded sampling, LR schedule, autocast, progress (paretorch.pipeline.core.progress)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.progress import phase
from paretorch.pipeline.core.spec import Batch, OutputKind, move_batch
from paretorch.pipeline.core.training_data import TrainingData
from paretorch.stages.distill.losses import LossWeights, captured_outputs, check_layer_names, hidden_loss, output_loss
from paretorch.stages.distill.lr_fit import FittedRate, NoRateHelps, fit_lr, not_lowered

Schedule = Literal["constant", "cosine", "linear"]
#: How many times a run updates the loss on its progress line (reading the loss waits for the device).
PROGRESS_LINES = 10
#: Samples (at most) of the training data on which the loss before and after is measured.
PROBE_SAMPLES = 256
#: With a padding mask, samples are sorted by length within groups of this many batches
#: (then the batches of a group are shuffled): little padding, still a random order.
LENGTH_GROUP_BATCHES = 16


def lr_factor(step: int, steps: int, schedule: Schedule, warmup: float) -> float:
    """Multiplier of the base learning rate at ``step`` (0-based): linear warm-up over the
    first ``warmup`` share of the steps, then constant, cosine or linear decay to 0."""
    warmup_steps = int(warmup * steps)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - progress


@dataclass(frozen=True)
class Optimization:
    """How the student is trained."""

    steps: int
    lr: float
    batch_size: int
    schedule: Schedule = "cosine"
    warmup: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    seed: int = 0
    #: Stop after this step of the ``steps``-long schedule (a replay of a run cut short by time).
    stop_step: int | None = None
    #: Stop once training has taken this long (the schedule stays that of ``steps``).
    max_seconds: float | None = None
    #: Fit the rate first (:func:`~paretorch.stages.distill.lr_fit.fit_lr`: ``lr`` is then the highest rate tried).
    fit_lr: bool = False


@dataclass(frozen=True)
class Outcome:
    """What one distillation run did: probe losses before and after, steps done and seconds."""

    loss_before: float
    loss_after: float
    steps: int
    seconds: float
    #: True when ``max_seconds`` ended training before ``steps``.
    cut_short: bool = False
    #: The learning rate trained with, and the range test that chose it (None: the configured rate, not fitted).
    lr: float = 0.0
    fitted: FittedRate | None = None
    #: Why no step ran and the student is the model as it came (no fitted rate lowered the loss).
    kept_start: str | None = None


class TeacherOutputs:
    """The frozen teacher's output per training sample, computed the first time a sample is
    seen: after one pass over the data, steps run the student alone. Off (``enabled=False``)
    when hidden layers are matched, and turned off when the output's shape varies by batch
    (e.g. per-token logits of length-cut batches)."""

    def __init__(self, samples: int, enabled: bool) -> None:
        self.samples, self.enabled = samples, enabled
        self.store: Tensor | None = None
        self.known = torch.zeros(samples, dtype=torch.bool)
        #: Teacher forward passes run (batches).
        self.passes = 0

    def lookup(self, index: Tensor) -> Tensor | None:
        if not self.enabled or self.store is None or not bool(self.known[index].all()):
            return None
        return self.store[index.to(self.store.device)]

    def keep(self, index: Tensor, output: Tensor) -> None:
        self.passes += 1
        if not self.enabled:
            return
        if self.store is None:
            self.store = output.new_empty((self.samples, *output.shape[1:]))
        if self.store.shape[1:] != output.shape[1:]:
            self.enabled, self.store = False, None
            return
        self.store[index.to(self.store.device)] = output.detach()
        self.known[index] = True


class Distiller:
    """One student, one frozen teacher and the training data, on one device."""

    def __init__(self, student: nn.Module, teacher: nn.Module, data: TrainingData, kind: OutputKind,
                 weights: LossWeights, device: torch.device, autocast_dtype: torch.dtype | None,
                 layer_map: tuple[tuple[str, str], ...] = (),
                 task_loss: Callable[[Tensor, Tensor], Tensor] | None = None,
                 teacher_outputs: TeacherOutputs | None = None) -> None:
        self.student, self.teacher, self.data, self.kind = student, teacher, data, kind
        self.weights, self.device, self.autocast_dtype = weights, device, autocast_dtype
        self.layer_map = layer_map
        self.task_loss = task_loss if data.targets is not None and weights.task else None
        self.student_layers = check_layer_names(student, [s for s, _ in layer_map], "student")
        self.teacher_layers = check_layer_names(teacher, [t for _, t in layer_map], "teacher")
        self.teacher.eval().requires_grad_(False)
        #: The teacher's outputs per sample: ``teacher_outputs`` where given (kept across distillations by the same
        #: teacher on the same data, :func:`paretorch.stages.distill.stage.shared_teacher_outputs`), unless layers are
        #: matched.
        self.teacher_outputs = (teacher_outputs if teacher_outputs is not None and not layer_map
                                else TeacherOutputs(data.samples, enabled=not layer_map))

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _teacher(self, index: Tensor, inputs: Batch) -> tuple[object, dict[str, Tensor]]:
        """The teacher's output on samples ``index`` (stored or computed) and its mapped layers' outputs."""
        stored = self.teacher_outputs.lookup(index)
        if stored is not None:
            return stored, {}
        with captured_outputs(self.teacher_layers) as hidden, torch.no_grad():
            output = self.teacher(*inputs)
        if isinstance(output, Tensor):
            self.teacher_outputs.keep(index, output)
        return output, hidden

    def loss(self, index: Tensor) -> Tensor:
        """The weighted loss of samples ``index`` (gradients flow into the student only)."""
        inputs, targets = self.data.batch(index)
        inputs = move_batch(inputs, self.device)
        targets = targets.to(self.device) if targets is not None else None
        with self._autocast():
            teacher_out, teacher_hidden = self._teacher(index, inputs)
            with captured_outputs(self.student_layers) as student_hidden:
                student_out = self.student(*inputs)
            if not isinstance(student_out, Tensor) or not isinstance(teacher_out, Tensor):
                raise InfeasibleConfig("distill: the model must return one tensor")
            loss = output_loss(self.kind, student_out, teacher_out, self.weights)
            if self.layer_map and self.weights.hidden:
                loss = loss + self.weights.hidden * hidden_loss(student_hidden, teacher_hidden, self.layer_map)
            if self.task_loss is not None and targets is not None:
                loss = loss + self.weights.task * self.task_loss(student_out.float(), targets)
        return loss.float()

    def probe_loss(self, batch_size: int) -> float:
        """Mean loss over the first :data:`PROBE_SAMPLES` training samples (no gradients)."""
        count = min(self.data.samples, PROBE_SAMPLES)
        total = 0.0
        with torch.no_grad():
            for start in range(0, count, batch_size):
                index = torch.arange(start, min(start + batch_size, count))
                total += float(self.loss(index)) * len(index)
        return total / count

    def _indices(self, batch_size: int, seed: int) -> Iterator[Tensor]:
        """Endless seeded batches of sample indices: a fresh permutation per pass over the data,
        grouped by length when the data has a padding mask (:func:`length_grouped`)."""
        generator = torch.Generator().manual_seed(seed)
        size = min(batch_size, self.data.samples)
        lengths = self.data.lengths
        while True:
            order = torch.randperm(self.data.samples, generator=generator)
            batches = [order[start : start + size] for start in range(0, self.data.samples - size + 1, size)]
            if lengths is not None:
                batches = length_grouped(batches, lengths, generator)
            yield from batches

    def run(self, opt: Optimization) -> Outcome:
        """Train the student for ``opt.steps`` steps (at a fitted rate with ``opt.fit_lr``); it is left in eval
        mode. A run that ends with the probe loss above where it started raises :class:`InfeasibleConfig`."""
        start = time.perf_counter()
        parameters = [p for p in self.student.parameters() if p.is_floating_point()]
        if not parameters:
            raise InfeasibleConfig("distill: the model has no floating-point parameters to train")
        for p in parameters:
            p.requires_grad_(True)
        self.student.eval()  # BatchNorm statistics and dropout as deployed
        before = self.probe_loss(opt.batch_size)
        fitted = None
        if opt.fit_lr:
            scaler = self._scaler()
            try:
                with phase(f"distill: fitting the learning rate (from {opt.lr:.2g} down)"):
                    fitted = fit_lr(self.student, parameters, opt.lr, opt.steps, before,
                                    lambda optimizer, index: self._step(optimizer, scaler, parameters, index, opt),
                                    lambda: self._indices(opt.batch_size, opt.seed),
                                    lambda: self.probe_loss(opt.batch_size), opt.weight_decay)
            except NoRateHelps as refused:  # the model as it came: distillation would only make it worse
                return Outcome(before, before, 0, time.perf_counter() - start, kept_start=str(refused))
        lr = fitted.lr if fitted is not None else opt.lr
        done, cut_short = self._train(parameters, opt, lr, start)
        after = self.probe_loss(opt.batch_size)
        if not_lowered(after, before):
            raise InfeasibleConfig(f"distill made the model worse: loss {before:.4g} -> {after:.4g} over {done} steps "
                                   f"at lr={lr:.2g} (leave distill out here, or try a lower lr)")
        return Outcome(before, after, done, time.perf_counter() - start, cut_short, lr, fitted)

    def _scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device.type, enabled=self.autocast_dtype == torch.float16)

    def _step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, parameters: list[nn.Parameter],
              index: Tensor, opt: Optimization) -> Tensor:
        """One training step on samples ``index``; its loss (a non-finite one raises :class:`InfeasibleConfig`)."""
        optimizer.zero_grad(set_to_none=True)
        loss = self.loss(index)
        if not bool(torch.isfinite(loss.detach())):
            rate = optimizer.param_groups[0]["lr"]
            raise InfeasibleConfig(f"distill diverged: loss is {float(loss)} at lr={rate:.2g} (try a smaller lr)")
        scaler.scale(loss).backward()
        if opt.grad_clip is not None:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(parameters, opt.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        return loss

    def _train(self, parameters: list[nn.Parameter], opt: Optimization, lr: float, start: float) -> tuple[int, bool]:
        """The run's steps at base rate ``lr`` on its schedule: (steps done, whether the time budget cut them short)."""
        optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=opt.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, opt.steps, opt.schedule, opt.warmup))
        scaler = self._scaler()
        every = max(1, opt.steps // PROGRESS_LINES)
        last = min(opt.steps, opt.stop_step or opt.steps)
        done, cut_short = 0, False
        with phase(f"distill: {last} steps", total=last) as shown:
            for step, index in zip(range(last), self._indices(opt.batch_size, opt.seed), strict=False):
                loss = self._step(optimizer, scaler, parameters, index, opt)
                scheduler.step()
                done = step + 1
                cut_short = opt.max_seconds is not None and time.perf_counter() - start > opt.max_seconds \
                    and done < last
                note = None
                if done % every == 0 or done == last or cut_short:
                    note = f"loss {float(loss.detach()):.5f}" + (
                        f", time budget of {opt.max_seconds:g} s reached" if cut_short else "")
                shown.advance(note=note)
                if cut_short:
                    break
        optimizer.zero_grad(set_to_none=True)
        for p in parameters:
            p.grad = None
        return done, cut_short


def length_grouped(batches: list[Tensor], lengths: Tensor, generator: torch.Generator) -> list[Tensor]:
    """The same samples re-batched: each run of :data:`LENGTH_GROUP_BATCHES` batches is sorted
    by sample length and cut again into batches of the same sizes, whose order is then shuffled."""
    grouped: list[Tensor] = []
    for start in range(0, len(batches), LENGTH_GROUP_BATCHES):
        group = batches[start : start + LENGTH_GROUP_BATCHES]
        samples = torch.cat(group)
        by_length = samples[torch.argsort(lengths[samples], descending=True, stable=True)]
        cut = list(torch.split(by_length, [len(b) for b in group]))
        grouped.extend(cut[i] for i in torch.randperm(len(cut), generator=generator).tolist())
    return grouped
