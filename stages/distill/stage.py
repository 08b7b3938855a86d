"""The distill stage: train the model so far (the student) to reproduce the unoptimized
model (the teacher, frozen), on the spec's training data -- never its evaluation data.

The loss follows the spec's output kind (``ModelSpec.output_kind``; ``auto`` decides from
the teacher's output): KL divergence at a temperature on logits, cosine plus MSE on
embeddings; optionally MSE between mapped hidden layers (``layer_map``: student module ->
teacher module, for students that lost layers); plus the spec's task loss when its
training data has labels. The data is :func:`paretorch.pipeline.core.training_data.distillation_data`.
The stage is structural for exports: its new weights are in the float graph they convert.
"""

from __future__ import annotations

import copy
import hashlib
import weakref
from typing import TYPE_CHECKING, Self

import torch
from pydantic import Field, model_validator
from torch import nn

from paretorch.pipeline.core.device import Capabilities, move_module
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.fidelity import infer_output_kind
from paretorch.pipeline.core.model_facts import ModelFacts
from paretorch.pipeline.core.spec import OutputKind
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext
from paretorch.pipeline.core.training_data import TrainingData, distillation_data
from paretorch.stages.distill.loop import Distiller, Optimization, Schedule, TeacherOutputs
from paretorch.stages.distill.losses import LossWeights

if TYPE_CHECKING:
    import optuna


#: Time budget of a searched distillation: cheap on a GPU (seconds), it would otherwise
#: take most of an hour per trial for MiniLM on one CPU core (about 1.6 s per step of 8).
SEARCH_TIME_BUDGET_S = 300.0
#: A search screens a distillation at this share of its steps first (:meth:`DistillConfig.low_fidelity`).
SCREEN_FRACTION = 0.25
#: Distillations shorter than this are not screened: the screen would save next to nothing.
SCREEN_MIN_STEPS = 8


class DistillConfig(StageConfig):
    """How to distill.

    * ``steps`` / ``lr`` / ``batch_size``: AdamW steps, base learning rate, samples per step.
    * ``fit_lr``: fit the rate to the model first (:mod:`paretorch.stages.distill.lr_fit`: ``lr`` and up to three
      rates below it, each for a few steps; the first that lowers the loss trains). The resolved config holds the
      fitted rate and ``fit_lr: false``, so a replay trains the same steps at the same rate.
    * ``schedule`` / ``warmup``: learning rate after a linear warm-up over the first
      ``warmup`` share of the steps: ``constant``, ``cosine`` or ``linear`` decay to 0.
    * ``temperature`` / ``kd_weight``: softmax temperature and weight of the KL term (logits).
    * ``cosine_weight`` / ``mse_weight``: weights of 1 - cosine and of MSE (embeddings).
    * ``layer_map`` / ``hidden_weight``: ``(student module, teacher module)`` pairs whose
      outputs are matched by MSE, and the weight of that term (empty: off).
    * ``task_weight``: weight of the spec's own loss on labelled training data (0: off).
    * ``weight_decay``, ``grad_clip`` (max gradient norm; None: off), ``seed`` (sample order).
    * ``max_seconds``: a time budget; training stops after the step that passes it (the
      learning-rate schedule stays that of ``steps``). The resolved config replaces it with
      ``stop_step``, the steps actually run, so a replay trains exactly the same steps.
    """

    stage = "distill"

    steps: int = Field(default=200, ge=1, le=100_000)
    lr: float = Field(default=1e-4, gt=0.0, le=1.0)
    fit_lr: bool = True
    batch_size: int = Field(default=32, ge=1, le=65_536)
    schedule: Schedule = "cosine"
    warmup: float = Field(default=0.1, ge=0.0, lt=1.0)
    temperature: float = Field(default=2.0, gt=0.0, le=100.0)
    kd_weight: float = Field(default=1.0, ge=0.0)
    cosine_weight: float = Field(default=1.0, ge=0.0)
    mse_weight: float = Field(default=1.0, ge=0.0)
    hidden_weight: float = Field(default=1.0, ge=0.0)
    layer_map: tuple[tuple[str, str], ...] = ()
    task_weight: float = Field(default=0.5, ge=0.0)
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    grad_clip: float | None = Field(default=1.0, gt=0.0)
    seed: int = Field(default=0, ge=0)
    max_seconds: float | None = Field(default=None, gt=0.0)
    stop_step: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _stop_within_steps(self) -> Self:
        if self.stop_step is not None and self.stop_step > self.steps:
            raise ValueError(f"stop_step={self.stop_step} must be at most steps={self.steps}")
        return self

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """Search space: off, or steps in {100, 200, 400}, lr in 1e-5..3e-3 (log) and, unless the
        spec's output is an embedding, a temperature in {1, 2, 4}; at most
        :data:`SEARCH_TIME_BUDGET_S` seconds of training. Off for a model the facts rule out (:func:`rules_out`)."""
        if ctx.facts is not None and rules_out(cls(), ctx.facts) is not None:
            return None
        if not trial.suggest_categorical("distill.enabled", [False, True]):
            return None
        steps = trial.suggest_categorical("distill.steps", [100, 200, 400])
        lr = trial.suggest_float("distill.lr", 1e-5, 3e-3, log=True)
        temperature = 2.0
        if ctx.spec.output_kind != "embedding":
            temperature = trial.suggest_categorical("distill.temperature", [1.0, 2.0, 4.0])
        return cls(steps=steps, lr=lr, temperature=temperature, max_seconds=SEARCH_TIME_BUDGET_S)

    def structure_only(self) -> None:
        """None: distillation changes weight values only (a rebuild from saved weights skips it)."""
        return None

    def low_fidelity(self) -> Self | None:
        """The screen of a search (:mod:`paretorch.pipeline.search.screening`): :data:`SCREEN_FRACTION` of the
        steps, of the time budget and of the stop step, the schedule fitted to the shorter run. None
        below :data:`SCREEN_MIN_STEPS` steps (cheap already)."""
        if self.steps < SCREEN_MIN_STEPS:
            return None
        fields = self.model_dump()
        fields["steps"] = max(1, round(self.steps * SCREEN_FRACTION))
        if self.max_seconds is not None:
            fields["max_seconds"] = self.max_seconds * SCREEN_FRACTION
        if self.stop_step is not None:
            fields["stop_step"] = min(fields["steps"], max(1, round(self.stop_step * SCREEN_FRACTION)))
        return type(self).model_validate(fields)

    def optimization(self) -> Optimization:
        return Optimization(steps=self.steps, lr=self.lr, batch_size=self.batch_size, schedule=self.schedule,
                            warmup=self.warmup, weight_decay=self.weight_decay, grad_clip=self.grad_clip,
                            seed=self.seed, stop_step=self.stop_step, max_seconds=self.max_seconds,
                            fit_lr=self.fit_lr)

    def loss_weights(self) -> LossWeights:
        return LossWeights(temperature=self.temperature, kd=self.kd_weight, cosine=self.cosine_weight,
                           mse=self.mse_weight, hidden=self.hidden_weight, task=self.task_weight)


def autocast_dtype(caps: Capabilities) -> torch.dtype | None:
    """The reduced dtype distillation runs under autocast: bfloat16 if it trains fast here (no
    loss scaling needed), else float16 if it does, else None (float32)."""
    for dtype in (torch.bfloat16, torch.float16):
        if dtype in caps.training_dtypes:
            return dtype
    return None


def output_kind(ctx: StageContext, teacher: nn.Module) -> OutputKind:
    """The spec's output kind, or for ``auto`` the kind of the teacher's output."""
    if ctx.spec.output_kind in ("logits", "embedding"):
        return "logits" if ctx.spec.output_kind == "logits" else "embedding"
    with torch.no_grad():
        output = teacher(*ctx.example_inputs())
    if not isinstance(output, torch.Tensor):
        raise InfeasibleConfig("distill: the model must return one tensor")
    return infer_output_kind(output)


#: The teacher's outputs per training sample, kept for the life of the process: every distillation of a search has
#: the unoptimized model as its teacher and the spec's training data, so a trial after the first runs the teacher
#: over no sample it already saw. Keyed weakly by the teacher's source module, then by what the outputs depend on
#: (the data's content digest, the output kind, the device, the autocast dtype).
_TEACHER_OUTPUTS: weakref.WeakKeyDictionary[nn.Module, dict[tuple[str, ...], TeacherOutputs]] = (
    weakref.WeakKeyDictionary())


def shared_teacher_outputs(teacher: nn.Module, data: TrainingData, kind: str, device: torch.device,
                           dtype: torch.dtype | None) -> TeacherOutputs:
    """The process's store of ``teacher``'s outputs on ``data`` (created empty the first time)."""
    digest = hashlib.sha256()
    for tensor in data.inputs:
        digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    key = (digest.hexdigest(), str(kind), device.type, str(dtype))
    return _TEACHER_OUTPUTS.setdefault(teacher, {}).setdefault(key, TeacherOutputs(data.samples, enabled=True))


def apply_distill(model: nn.Module, config: DistillConfig, ctx: StageContext) -> nn.Module:
    """Distill the teacher (``ctx.source_model``; without one, the input model itself) into
    ``model`` (the registry's copy) on ``ctx.device``; returns it in eval mode.

    Records ``distill.seconds`` (training time, apart from latency), ``distill.loss_before``
    and ``distill.loss_after`` (mean loss on up to 256 training samples), ``distill.steps``,
    ``distill.teacher_passes`` (teacher forward batches: its outputs are kept per sample),
    ``distill.samples``, ``distill.data`` (which spec data: training, training_inputs or
    calibration), ``distill.output_kind``, ``distill.autocast`` (dtype or float32), ``distill.lr`` (the rate
    trained with) and, when fitted, ``distill.lr_fit`` (each rate tried and its loss). A run that leaves the loss
    above its start is :class:`InfeasibleConfig` (the trial stops there, with its reason); one whose range test
    finds no rate that lowers it trains no step and returns the model as it came, ``distill.kept_start`` saying
    why.
    """
    data = distillation_data(ctx.spec)
    if data is None:
        raise InfeasibleConfig(f"distill with steps={config.steps} needs training data, but spec "
                               f"'{ctx.spec.name}' has no training(), training_inputs() or calibration() batches")
    teacher_source = ctx.source_model if ctx.source_model is not None else model
    teacher = move_module(copy.deepcopy(teacher_source), ctx.device).eval()
    student = move_module(model, ctx.device).eval()
    kind = output_kind(ctx, teacher)
    dtype = autocast_dtype(ctx.capabilities)
    shared = shared_teacher_outputs(teacher_source, data, kind, ctx.device, dtype)
    passes_before = shared.passes
    distiller = Distiller(student, teacher, data, kind, config.loss_weights(), ctx.device, dtype,
                          layer_map=config.layer_map, task_loss=ctx.spec.loss, teacher_outputs=shared)
    outcome = distiller.run(config.optimization())
    ctx.record("distill.seconds", outcome.seconds)
    ctx.record("distill.loss_before", outcome.loss_before)
    ctx.record("distill.loss_after", outcome.loss_after)
    ctx.record("distill.steps", outcome.steps)
    ctx.record("distill.teacher_passes", distiller.teacher_outputs.passes - (
        passes_before if distiller.teacher_outputs is shared else 0))
    ctx.record("distill.lr", outcome.lr)
    if outcome.kept_start is not None:
        ctx.record("distill.kept_start", outcome.kept_start)
    resolved: dict[str, object] = {}
    if outcome.fitted is not None:
        ctx.record("distill.lr_fit", ", ".join(f"{rate:.2g} -> {loss:.4g}" for rate, loss in outcome.fitted.tried))
        resolved.update(lr=outcome.lr, fit_lr=False)
    if outcome.cut_short:
        budget = f"time budget of {config.max_seconds:g} s"
        ctx.record("distill.cut_short", f"{budget}: {outcome.steps} of {config.steps} steps")
        resolved.update(max_seconds=None, stop_step=outcome.steps)
    if resolved:
        ctx.resolve(config.model_copy(update=resolved))
    ctx.record("distill.samples", data.samples)
    ctx.record("distill.data", data.source)
    ctx.record("distill.output_kind", kind)
    ctx.record("distill.autocast", str(dtype).removeprefix("torch.") if dtype is not None else "float32")
    return student.eval()


def rules_out(config: DistillConfig, facts: ModelFacts) -> str | None:
    """A TorchScript model: training needs its parameters as Python modules (ScriptModules have no requires_grad_)."""
    return facts.scripted_reason("distillation cannot train (requires_grad_ is not supported on ScriptModules)")


def short(config: DistillConfig) -> str:
    """``distill 200``: the steps that ran (a time budget that stopped it early resolves to ``stop_step``)."""
    return f"distill {config.stop_step or config.steps}"


STAGE = Stage(DistillConfig, apply_distill, order=20, rules_out=rules_out, short=short)
