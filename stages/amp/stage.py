"""The amp stage: a calibrated mixed-precision policy, baked into the model.

Calibration (``fp32_layers=None``) measures, on the spec's calibration batches,
how much each layer alone in the reduced dtype moves the model output, then
starts from every layer reduced and moves the most sensitive layers back to
float32 until the whole model is within ``error_budget`` (see
:mod:`paretorch.stages.amp.calibrate`). The fully determined policy is handed
back through ``ctx.resolve`` so the recipe replays without calibrating.

The policy persists in the returned module, not in an autocast context
(:mod:`paretorch.stages.amp.switch`): a policy that reduces every layer is exactly
``model.to(dtype)`` with floating inputs cast to ``dtype`` and floating outputs to
float32 at the model boundary, no per-layer cast; a partial policy holds reduced
layers' parameters (and floating buffers) in the reduced dtype and float32 layers'
in float32, and casts a layer's floating inputs only where they arrive in another
dtype than the layer's. Either way the state dict shrinks, the model's floating
outputs come back as float32 and integer inputs are never cast. The casts are
functions bound with ``functools.partial`` (:mod:`paretorch.stages.amp.casting`), so the model
survives ``copy.deepcopy``, ``torch.compile`` (one graph, no break) and
``torch.export.export``; the module names do not change.

Records: ``amp.calibration`` ("measured", or "reused": the sensitivities of an earlier
calibration of the same input model and dtype, in this process or an earlier one, see
:data:`paretorch.stages.common.sensitivity.SENSITIVITIES`),
``amp.sensitivity`` ({layer: error with that layer alone reduced}),
``amp.output_error`` (the chosen policy's error), ``amp.steps`` ([layers kept in
float32, error] per measurement); when they apply, ``amp.groups`` (sibling layers
switched together because one alone breaks the forward pass, e.g. the query / key /
value projections feeding one attention op) and ``amp.pinned`` ({layer: why it
stays float32}).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Literal, Self

import torch
from pydantic import Field, StringConstraints, field_validator
from torch import nn

from paretorch.pipeline.core.device import Capabilities, move_module
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.model_facts import ModelFacts
from paretorch.pipeline.core.short_notation import kept_layers
from paretorch.pipeline.core.stage import BudgetUse, Stage, StageConfig, StageContext, export_mirror
from paretorch.stages.amp.casting import REDUCED_DTYPES, dtype_name
from paretorch.stages.amp.switch import PrecisionSwitch
from paretorch.stages.amp.units import find_precision_units
from paretorch.stages.common.mirror_facts import ReducedPrecision, WeightQuantization
from paretorch.stages.common.rankings import SENSITIVITIES
from paretorch.stages.common.sensitivity import calibrate, run_forward

if TYPE_CHECKING:
    import optuna

LayerName = Annotated[str, StringConstraints(min_length=1, strip_whitespace=True)]
#: Probe batch size for the forward that checks the result and finds the layer casts it needs.
PROBE_BATCH = 2


class AmpConfig(StageConfig):
    """Run the model in mixed precision: some layers in ``dtype``, the rest in float32.

    * ``dtype``: the reduced dtype; ``"auto"`` takes the device's preferred one
      (``Capabilities.preferred_reduced_dtype()``: bfloat16 on a CPU with bf16
      kernels, float16 on MPS). A dtype the device cannot run is infeasible.
    * ``error_budget``: the allowed relative output error of the whole model against
      float32 on the calibration batches, in (0, 1]: with ``r`` the float32 model's
      floating outputs and ``y`` the mixed model's (cast to float32), over all
      calibration batches and output tensors,
      ``sqrt(sum ||y - r||^2) / sqrt(sum ||r||^2)`` (Frobenius norms). 0.01 = 1 %.
    * ``fp32_layers``: None calibrates the policy; a tuple applies it as given (replay):
      these modules (and the layers below or above them) compute in float32, every
      other layer in ``dtype``; ``error_budget`` is then not used. The resolved config
      of a calibrated run lists every float32 layer, including those pinned to float32
      (protected by the spec, already quantized, tied weights).
    """

    stage = "amp"

    dtype: Literal["auto", "float16", "bfloat16"] = "auto"
    error_budget: float = Field(default=0.01, gt=0.0, le=1.0)
    fp32_layers: tuple[LayerName, ...] | None = None

    @field_validator("fp32_layers")
    @classmethod
    def _no_duplicate_layers(cls, layers: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if layers is not None:
            duplicates = sorted({name for name in layers if layers.count(name) > 1})
            if duplicates:
                raise ValueError(f"layers listed twice: {', '.join(duplicates)}")
        return layers

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """``amp.enabled`` (off -> None), ``amp.dtype`` over "auto" and this device's *fast*
        reduced dtypes, ``amp.error_budget`` log-uniform in [1e-3, 5e-2]. A device without a
        fast reduced dtype (``Capabilities.fast_dtypes``) gets no AMP trial: it could only be
        slower than float32 there (nothing is suggested, the stage stays off); nor does a model the
        facts rule out (:func:`rules_out`: a TorchScript model)."""
        names = [dtype_name(d) for d in ctx.capabilities.fast_dtypes if dtype_name(d) in REDUCED_DTYPES]
        if not names or (ctx.facts is not None and rules_out(cls(), ctx.facts) is not None):
            return None
        if not trial.suggest_categorical("amp.enabled", [False, True]):
            return None
        dtype = trial.suggest_categorical("amp.dtype", ["auto", *names])
        error_budget = trial.suggest_float("amp.error_budget", 1e-3, 5e-2, log=True)
        return cls.model_validate({"dtype": dtype, "error_budget": error_budget})

    def budget_use(self) -> BudgetUse | None:
        if not self.fp32_layers:
            return None
        return BudgetUse("amp.error_budget", self.error_budget, len(self.fp32_layers))


def reduced_dtype(config: AmpConfig, capabilities: Capabilities) -> torch.dtype:
    """The concrete reduced dtype of ``config`` on a device; :class:`InfeasibleConfig` if it cannot run there."""
    if config.dtype == "auto":
        preferred = capabilities.preferred_reduced_dtype()
        if preferred is None:
            raise InfeasibleConfig(f"amp: dtype='auto' but {capabilities.kind} has no reduced floating dtype")
        dtype = preferred
    else:
        dtype = REDUCED_DTYPES[config.dtype]
    capabilities.require_dtype(dtype)
    if dtype_name(dtype) not in REDUCED_DTYPES:
        raise InfeasibleConfig(f"amp: {dtype} is not a reduced dtype this stage knows ({', '.join(REDUCED_DTYPES)})")
    return dtype


def apply(model: nn.Module, config: AmpConfig, ctx: StageContext) -> nn.Module:
    """Calibrate (or replay) ``config``'s policy and apply it to ``model`` (the runner's copy).

    Raises :class:`InfeasibleConfig` when the dtype cannot run on the device, the model
    has no layer to reduce, calibration has no batches, or a forward pass fails; a
    ``fp32_layers`` name that is no module of the model is a ``ConfigError``."""
    dtype = reduced_dtype(config, ctx.capabilities)
    model = move_module(model, ctx.device).eval()
    units = find_precision_units(model, ctx.spec.protected_layers)
    if not units.candidates:
        why = "; ".join(f"{name}: {reason}" for name, reason in units.pinned.items()) or (
            "no sub-module holds floating parameters; the root module's own parameters stay as they are"
        )
        raise InfeasibleConfig(f"amp: no layer can run in {dtype_name(dtype)} ({why})")
    switch = PrecisionSwitch(model, units, dtype)
    if config.fp32_layers is None:
        batches = ctx.calibration_batches
        if not batches:
            raise InfeasibleConfig("amp: calibration needs batches; the spec's calibration() gave none")
        key = _ranking_key(ctx, dtype)
        known = SENSITIVITIES.get(key) if key is not None else None
        result = calibrate(
            switch, units.candidates, batches, config.error_budget, known, stage="amp", change="reduced"
        )
        if key is not None:
            SENSITIVITIES.put(key, result.ranking)
        ctx.record("amp.calibration", "reused" if known is not None else "measured")
        ctx.record("amp.sensitivity", result.sensitivity)
        ctx.record("amp.output_error", result.output_error)
        ctx.record("amp.steps", [list(step) for step in result.steps])
        if result.groups:
            ctx.record("amp.groups", [list(group) for group in result.groups])
        pinned = {**units.pinned, **result.unreducible}
    else:
        fp32 = units.units_for(config.fp32_layers)
        switch.set_reduced(name for name in units.candidates if name not in fp32)
        pinned = dict(units.pinned)
    if pinned:
        ctx.record("amp.pinned", pinned)
    probe = ctx.example_inputs(PROBE_BATCH)
    switch.keep_needed_casts(lambda: run_forward(model, probe, "of the mixed-precision model", "amp"))
    resolved = {"dtype": dtype_name(dtype), "error_budget": config.error_budget, "fp32_layers": switch.fp32_units()}
    ctx.resolve(AmpConfig.model_validate(resolved))
    return model


def _ranking_key(ctx: StageContext, dtype: torch.dtype) -> tuple[str, ...] | None:
    """What a calibration ranking depends on: the input model (by content key), the
    dtype, the spec (its calibration batches and protected layers) and the device kind."""
    if ctx.input_key is None:
        return None
    return ("amp", ctx.input_key, dtype_name(dtype), ctx.spec.name, ctx.device.type)


def requires(config: AmpConfig, caps: Capabilities) -> str | None:
    """The dtype must run on the device (``auto``: the device must have a reduced dtype)."""
    try:
        reduced_dtype(config, caps)
    except InfeasibleConfig as exc:
        return exc.reason.removeprefix("amp: ")
    return None


def worthwhile(config: AmpConfig, caps: Capabilities) -> str | None:
    """A reduced dtype without fast kernels on the device only makes the model slower."""
    try:
        dtype = reduced_dtype(config, caps)
    except InfeasibleConfig as exc:
        return exc.reason.removeprefix("amp: ")
    if dtype not in caps.fast_dtypes:
        return f"{dtype_name(dtype)} is not faster than float32 on {caps.kind} (no fast reduced dtype)"
    return None


def rules_out(config: AmpConfig, facts: ModelFacts) -> str | None:
    """A TorchScript model: the policy's casts are forward hooks and a replaced forward, which ScriptModules lack."""
    return facts.scripted_reason("AMP cannot cast layer by layer (its forward hooks: register_forward_hook "
                                 "is not supported on ScriptModules)")


def after(config: AmpConfig, upstream: Sequence[StageConfig]) -> str | None:
    """A statically quantized (PT2E) graph computes its integer matmuls from float32 activations: AMP's casts
    would feed them another dtype."""
    quant = export_mirror(upstream).of(WeightQuantization)
    if quant is not None and quant.activations == "static":
        return (f"AMP cannot run over the {quant.method} graph (its quantized matmuls take float32 "
                "activations): use one of the two, or int8_dynamic with AMP")
    return None


def mirror(config: AmpConfig) -> ExportMirror:
    """The reduced dtype and the float32 layers kept: the precisions a runtime must reproduce
    (:meth:`ReducedPrecision.needs`; Core ML keeps the layers, OpenVINO runs whole-model bf16, ONNX Runtime
    float32 only, as each declares)."""
    fp32_layers = tuple(config.fp32_layers or ())
    return ExportMirror((ReducedPrecision(dtype=config.dtype, fp32_layers=fp32_layers),))


#: Each reduced dtype as the short notation and the machine probe name it (``auto``, the device's choice, is known
#: only on the device: the notation writes ``amp``, the probe judges nothing).
PRECISIONS = {"bfloat16": "bf16", "float16": "fp16"}


def precision(config: AmpConfig) -> str | None:
    """The matmul precision of the reduced layers (None for ``auto``: the device decides when it runs)."""
    return PRECISIONS.get(config.dtype)


def short(config: AmpConfig) -> str:
    """``bf16`` (the whole model), ``bf16 (12 fp32)`` (12 layers kept in float32), ``amp`` for ``auto``."""
    return PRECISIONS.get(config.dtype, "amp") + kept_layers(len(config.fp32_layers or ()))


STAGE = Stage(AmpConfig, apply, numeric=True, mirror=mirror, requires=requires, order=40, worthwhile=worthwhile,
              rules_out=rules_out, precision=precision, after=after, short=short)
