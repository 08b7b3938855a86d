"""The quantize stage: torchao weight-only / dynamic quantization of Linear layers, or
static int8 PT2E quantization of convolutions and linears.

Methods (the records of :data:`paretorch.stages.quantize.methods.METHODS`: how each is built, where it
runs and how exports mirror it):

* ``int8_weight_only``, ``int8_dynamic``, ``int4_weight_only``, ``intx_weight_only``
  (int4 weights, per group), ``float8_weight_only``, ``float8_dynamic``: torchao
  ``quantize_`` on ``nn.Linear`` layers; convolutions stay float.
* ``int8_static_pt2e``: ``torch.export`` + the x86 inductor quantizer, calibrated on the
  spec's calibration batches; quantizes convolutions and linears (integer tensors, e.g. the
  position ids MPNet and RoBERTa compute, are never observed: :mod:`.integer_observers`). The result is a
  ``GraphModule`` that is slow eager and fast under ``torch.compile`` with inductor
  freezing (see :data:`paretorch.stages.quantize.static_pt2e.INDUCTOR_FREEZING_META_KEY`). A failing
  step's infeasible line names it and, where a graph ran, the op that raised (:mod:`.graph_failure`).

``mapping="asymmetric"`` is accepted only where the torchao config has a choice:
``intx_weight_only`` (weight mapping) and ``int8_dynamic`` (activation mapping; its
weights stay symmetric). Any other combination is rejected when the config is built,
so an invalid recipe fails before a search starts.

Layer filter (quantize_ methods and PT2E alike): the output head (the layer whose output
is the model output) when ``skip_head``; the spec's ``protected_layers`` (and modules
below them); weights with fewer than ``min_weight_elements`` elements; for the per-group
methods, layers whose input size is not a multiple of ``group_size``. The chosen and the
skipped layers are recorded as ``quantize.layers`` and ``quantize.skipped``.

Accuracy budget (``fallback_budget``, any method): the selected layers are ranked by
sensitivity (the relative output error of the whole model when that layer alone is
quantized, the measure AMP uses: :mod:`paretorch.stages.common.sensitivity`) on the first
``calibration_batches`` calibration batches, parent blocks first; then the most sensitive
layers go back to float until the error is within the budget, or ``calibration_seconds``
run out (the best policy so far is kept). Rankings are reused across trials and runs
(keyed by the input model, method and settings). The resolved config lists the float
layers (``float_layers``), so the recipe replays without calibrating, and the exports
leave them float too. Records: ``quantize.float_layers`` ({layer: its sensitivity}),
``quantize.calibration`` ("measured" / "reused"), ``quantize.calibration_seconds``,
``quantize.output_error`` (of the quantized model, measured), ``quantize.sensitivity``
and, when the time budget ended it, ``quantize.calibration_cut_short`` (why).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Literal, Self

import torch
from pydantic import Field, StringConstraints, field_validator, model_validator
from torch import nn

from paretorch.pipeline.core.device import Capabilities, move_module
from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig, PipelineError
from paretorch.pipeline.core.length_groups import PACK
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.model_facts import ModelFacts
from paretorch.pipeline.core.stage import BudgetUse, Stage, StageConfig, StageContext, stage_for
from paretorch.stages.common.mirror_facts import WeightQuantization
from paretorch.stages.common.rankings import SENSITIVITIES
from paretorch.stages.common.sensitivity import calibrate, reference_outputs, relative_output_error
from paretorch.stages.quantize.facts import QuantizeFacts, read_facts, why_untouched
from paretorch.stages.quantize.fallback import QuantizedSwap, SimulatedStaticInt8
from paretorch.stages.quantize.graph_failure import StaticStepError, failing_op
from paretorch.stages.quantize.layers import CONV_AND_LINEAR_TYPES, LINEAR_TYPES, LayerSelection, select_layers
from paretorch.stages.quantize.methods import METHODS, method, methods_on
from paretorch.stages.quantize.notation import precision, short
from paretorch.stages.quantize.static_pt2e import quantize_static_pt2e, quantized_layer_names
from paretorch.stages.quantize.weight_methods import quantize_linear_layers

if TYPE_CHECKING:
    import optuna

GROUP_SIZES = (32, 64, 128, 256)
#: A search screens a calibration at this share of its time budget (and one batch) first.
SCREEN_FRACTION = 0.25
LayerName = Annotated[str, StringConstraints(min_length=1, strip_whitespace=True)]


class QuantizeConfig(StageConfig):
    """Quantize the model's weights (and activations, for the dynamic and static methods)."""

    stage = "quantize"

    #: A name from :data:`paretorch.stages.quantize.methods.METHODS`.
    method: str
    #: Elements per quantization group along the input dimension (int4 / intx only; ignored otherwise).
    group_size: Literal[32, 64, 128, 256] = 128
    #: Symmetric or asymmetric integer mapping where the method offers the choice (see module docstring).
    mapping: Literal["symmetric", "asymmetric"] = "symmetric"
    #: Layers whose weight has fewer elements stay float.
    min_weight_elements: int = Field(default=1024, ge=0)
    #: Keep the output layer (the one producing the model output) in float.
    skip_head: bool = True
    #: Allowed relative output error vs the float model (AMP's measure); the most sensitive
    #: layers stay float until it holds. None: quantize every selected layer.
    fallback_budget: float | None = Field(default=None, gt=0.0, le=1.0)
    #: Layers kept float (replay of a calibrated run; no calibration). None: calibrate if
    #: ``fallback_budget`` is set.
    float_layers: tuple[LayerName, ...] | None = None
    #: Calibration batches the sensitivity measurement reads (the first ones of the spec's).
    calibration_batches: int = Field(default=2, ge=1)
    #: Time budget of the calibration in seconds; when it runs out the best policy so far is kept.
    calibration_seconds: float = Field(default=120.0, gt=0.0)

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        method(value)  # ValueError naming the known methods
        return value

    @model_validator(mode="after")
    def _mapping_supported(self) -> Self:
        if self.mapping == "asymmetric" and method(self.method).mapping_target is None:
            supported = ", ".join(f"{m.name} ({m.mapping_target})" for m in METHODS.values() if m.mapping_target)
            raise ValueError(
                f"mapping='asymmetric' is not supported by method='{self.method}' "
                f"(its torchao recipe fixes the mapping); asymmetric is supported by: {supported}"
            )
        return self

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """``quantize.method`` over "none" + the methods this device runs; ``quantize.group_size``
        and ``quantize.mapping`` only for the methods that use them. What the model's facts rule out
        (:func:`rules_out`) is not offered: a method that touches no layer of this model (on a CNN whose
        only Linear is its head, the torchao methods: PT2E static int8, which touches its convolutions,
        stays), and ``quantize.fallback`` where the method touches one layer only."""
        name = trial.suggest_categorical("quantize.method", ctx.offered(
            "quantize.method", ["none", *methods_on(ctx.capabilities)],
            lambda choice: None if choice == "none" else _ruled_out(cls(method=choice), ctx)))
        if name == "none":
            return None
        record = method(name)
        group_size = 128
        if record.grouped:
            group_size = trial.suggest_categorical("quantize.group_size", list(GROUP_SIZES))
        mapping = "symmetric"
        if record.mapping_target is not None:
            mapping = trial.suggest_categorical("quantize.mapping", ["symmetric", "asymmetric"])
        budget = None
        fallback = _ruled_out(cls(method=name, fallback_budget=1e-2), ctx) is None
        if fallback and trial.suggest_categorical("quantize.fallback", [False, True]):
            budget = trial.suggest_float("quantize.fallback_budget", 1e-3, 5e-2, log=True)
        # model_validate: the values come from Optuna as plain str/int; pydantic checks them.
        return cls.model_validate(
            {"method": name, "group_size": group_size, "mapping": mapping, "fallback_budget": budget}
        )

    def low_fidelity(self) -> Self | None:
        """The screen of a search (:mod:`paretorch.pipeline.search.screening`): a calibrating config (a
        ``fallback_budget``, no ``float_layers``) on one calibration batch and a quarter of its time
        budget; None for a config that does not calibrate."""
        if self.fallback_budget is None or self.float_layers is not None:
            return None
        return type(self).model_validate({**self.model_dump(), "calibration_batches": 1,
                                          "calibration_seconds": self.calibration_seconds * SCREEN_FRACTION})

    def budget_use(self) -> BudgetUse | None:
        if self.fallback_budget is None or not self.float_layers:
            return None
        return BudgetUse("quantize.fallback_budget", self.fallback_budget, len(self.float_layers))


#: What to do when a static (PT2E) method cannot trace the model.
PT2E_HINT = ("PT2E quantization traces the whole model with torch.export, which cannot trace a stage that runs "
             "outside the graph (the pack stage's packing): quantize before it, or use int8_dynamic")


def _quantize_error(config: QuantizeConfig, what: str, exc: Exception,
                    upstream: tuple[StageConfig, ...] = (), op: str | None = None) -> InfeasibleConfig:
    """One line: the library call that failed (for the static method its step, and the op of the graph that
    raised: ``op``, or the one :class:`StaticStepError` names) and the error's first line (torch.export's errors run
    to dozens); the PT2E hint about packing only where the recipe packs before quantizing (``upstream``: the stages
    before this one)."""
    static = method(config.method).is_static
    call = ("torch.export + the x86 inductor quantizer (prepare, calibrate, convert)" if static
            else "torchao's quantize_") if what == "quantization" else "the quantized model's forward"
    if isinstance(exc, StaticStepError):
        call, op, exc = exc.step, exc.op, exc.cause
    first = next((line for line in str(exc).splitlines() if line.strip()), "")
    at = f" at {op}" if op else ""
    packed = any(c.stage == PACK for c in upstream)
    hint = f" ({PT2E_HINT})" if static and what == "quantization" and packed else ""
    return InfeasibleConfig(f"{config.method}: {what} failed in {call}{at}: {type(exc).__name__}: {first}{hint}")


def _select(model: nn.Module, config: QuantizeConfig, ctx: StageContext) -> LayerSelection:
    static = method(config.method).is_static
    try:
        selection = select_layers(
            model,
            ctx.example_inputs(),
            layer_types=CONV_AND_LINEAR_TYPES if static else LINEAR_TYPES,
            min_weight_elements=config.min_weight_elements,
            skip_head=config.skip_head,
            protected=ctx.spec.protected_layers,
            group_size=config.group_size if method(config.method).grouped else None,
        )
    except Exception as exc:  # the float model's own forward failed: not a quantization problem
        raise InfeasibleConfig(f"quantize: forward of the input model failed: {type(exc).__name__}: {exc}") from exc
    if not selection.selected:
        kinds = "Conv/Linear" if static else "Linear"
        skipped = "; ".join(f"{name}: {why}" for name, why in selection.skipped.items()) or "the model has none"
        raise InfeasibleConfig(f"{config.method}: no {kinds} layer passes the filter ({skipped})")
    return selection


def apply(model: nn.Module, config: QuantizeConfig, ctx: StageContext) -> nn.Module:
    """Quantize ``model`` (the runner's copy) with ``config``; raise :class:`InfeasibleConfig`
    if the method has no kernel here, no layer passes the filter, torchao rejects the model,
    or the quantized model's forward fails."""
    model = move_module(model, ctx.device).eval()
    selection = _select(model, config, ctx)
    calibrating = config.float_layers is None and config.fallback_budget is not None
    if calibrating and not ctx.calibration_batches:
        raise InfeasibleConfig(f"{config.method}: fallback_budget needs calibration batches; the spec gave none")
    batches = ctx.calibration_batches[: config.calibration_batches]
    reference = reference_outputs(model, batches, "quantize") if calibrating else []
    if config.float_layers is not None:
        selection = _keep_float(selection, _known_layers(config.float_layers, selection), "float_layers")
    elif config.fallback_budget is not None:
        selection = _keep_float(selection, _calibrate_fallback(model, config, ctx, selection), "fallback_budget")
    try:
        if method(config.method).is_static:
            if not ctx.calibration_batches:
                raise InfeasibleConfig(f"{config.method} needs calibration batches; the spec's calibration() gave none")
            model = quantize_static_pt2e(model, ctx.example_inputs(), ctx.calibration_batches, selection.skipped.keys())
            layers = quantized_layer_names(model)
        else:
            quantize_linear_layers(model, config.method, config.group_size, config.mapping, selection.selected)
            layers = selection.selected
    except PipelineError:
        raise
    except Exception as exc:  # torchao / torch.export raise many types for unsupported models
        raise _quantize_error(config, "quantization", exc, ctx.upstream) from exc
    if not layers:
        raise InfeasibleConfig(f"{config.method}: every layer stays float: {_why_all_float(selection, config)}")
    try:
        with torch.no_grad():
            model(*ctx.example_inputs())
    except Exception as exc:  # a quantized model whose forward fails is an infeasible trial
        raise _quantize_error(config, "forward of the quantized model", exc, ctx.upstream,
                              failing_op(model, ctx.example_inputs())) from exc
    ctx.record("quantize.layers", layers)
    ctx.record("quantize.skipped", dict(selection.skipped))
    if calibrating:
        ctx.record("quantize.output_error", relative_output_error(model, batches, reference, "quantized", "quantize"))
        float_layers = tuple(ctx.records["quantize.float_layers"])
        ctx.resolve(config.model_copy(update={"float_layers": float_layers}))
    return model


def _known_layers(layers: tuple[str, ...], selection: LayerSelection) -> dict[str, float]:
    """``float_layers`` of a replayed config: each must be a layer the filter selected or skipped."""
    unknown = [name for name in layers if name not in selection.selected and name not in selection.skipped]
    if unknown:
        known = ", ".join([*selection.selected, *selection.skipped][:12])
        raise ConfigError(f"quantize: float_layers names no quantizable layer: {', '.join(unknown)} (layers: {known})")
    return dict.fromkeys(layers, float("nan"))


def _why_all_float(selection: LayerSelection, config: QuantizeConfig) -> str:
    """Why a config quantized nothing: the layers its fallback budget or ``float_layers`` kept float, or the
    quantizer's own choice."""
    budget = "the fallback budget" + ("" if config.fallback_budget is None else f" {config.fallback_budget:g}")
    for field, what in (("fallback_budget", budget), ("float_layers", "float_layers")):
        kept = [name for name, why in selection.skipped.items() if why == f"kept float ({field})"]
        if kept and not selection.selected:
            more = " (a larger budget quantizes some)" if field == "fallback_budget" else ""
            return f"{what} kept all {len(kept)} selected layer(s) float{more}"
    return f"the quantizer converted none of the {len(selection.selected)} selected layer(s)"


def _keep_float(selection: LayerSelection, float_layers: dict[str, float], why: str) -> LayerSelection:
    kept = set(float_layers)
    skipped = dict(selection.skipped)
    skipped.update({name: f"kept float ({why})" for name in selection.selected if name in kept})
    return LayerSelection(selected=[name for name in selection.selected if name not in kept], skipped=skipped)


def _calibrate_fallback(
    model: nn.Module, config: QuantizeConfig, ctx: StageContext, selection: LayerSelection
) -> dict[str, float]:
    """The selected layers that stay float to hold ``config.fallback_budget``, each with its
    sensitivity (records what calibration did)."""
    budget = config.fallback_budget
    if budget is None:
        raise ValueError("_calibrate_fallback needs a fallback_budget")
    started = time.monotonic()
    batches = ctx.calibration_batches[: config.calibration_batches]
    layers = selection.selected
    switch: QuantizedSwap | SimulatedStaticInt8
    if method(config.method).is_static:
        switch = SimulatedStaticInt8(model, layers, batches)
    else:
        def quantize(copy: nn.Module) -> None:
            quantize_linear_layers(copy, config.method, config.group_size, config.mapping, layers)

        try:
            switch = QuantizedSwap(model, layers, quantize)
        except Exception as exc:  # torchao raises many types for unsupported models
            raise _quantize_error(config, "quantization", exc) from exc
    key = _ranking_key(config, ctx, layers)
    known = SENSITIVITIES.get(key) if key is not None else None
    result = calibrate(
        switch, layers, batches, budget, known, stage="quantize", change="quantized", blocks=True,
        seconds=config.calibration_seconds, refine=True,
    )
    if key is not None and result.cut_short is None:
        SENSITIVITIES.put(key, result.ranking)
    float_layers = {name: result.sensitivity.get(name, float("nan")) for name in layers if name not in result.changed}
    ctx.record("quantize.calibration", "reused" if known is not None else "measured")
    ctx.record("quantize.calibration_seconds", time.monotonic() - started)
    ctx.record("quantize.sensitivity", result.sensitivity)
    ctx.record("quantize.steps", [list(step) for step in result.steps])
    ctx.record("quantize.float_layers", float_layers)
    ctx.record("quantize.refined_layers", len(result.refined))
    if result.cut_short is not None:
        ctx.record("quantize.calibration_cut_short", result.cut_short)
    return float_layers


def _ranking_key(config: QuantizeConfig, ctx: StageContext, layers: list[str]) -> tuple[str, ...] | None:
    """What a ranking depends on: the input model (content key), the method and its settings,
    the calibration subset, the candidate layers, the spec and the device kind."""
    if ctx.input_key is None:
        return None
    return ("quantize", ctx.input_key, config.method, str(config.group_size), config.mapping,
            str(config.calibration_batches), ",".join(layers), ctx.spec.name, ctx.device.type)


def rules_out(config: QuantizeConfig, facts: ModelFacts) -> str | None:
    """Why ``config`` cannot change the model ``facts`` describe (:mod:`paretorch.stages.quantize.facts`): a
    TorchScript model, no layer its method touches, every one kept float, a fallback over one layer."""
    if (scripted := facts.scripted_reason("quantization cannot rewrite")) is not None:
        return scripted
    known = facts.of(QuantizeConfig.stage)
    if not isinstance(known, QuantizeFacts):
        return None
    return why_untouched(known, config.method, config.min_weight_elements, config.skip_head, config.float_layers,
                         config.fallback_budget)


def after(config: QuantizeConfig, upstream: Sequence[StageConfig]) -> str | None:
    """Static PT2E int8 exports the model with ``torch.export`` first: a stage before it whose model cannot be
    traced (pack's data-dependent token gather) leaves nothing to quantize."""
    if not method(config.method).is_static:
        return None
    untraceable = [u.stage for u in upstream if not stage_for(u).traceable]
    if untraceable:
        return (f"{config.method} traces the model with torch.export, which cannot trace what "
                f"{', '.join(untraceable)} made: use int8_dynamic after it")
    return None


def _ruled_out(config: QuantizeConfig, ctx: StageContext) -> str | None:
    return rules_out(config, ctx.facts) if ctx.facts is not None else None


def requires(config: QuantizeConfig, caps: Capabilities) -> str | None:
    """The method's kernel must exist on the device (see the method table)."""
    return method(config.method).unavailable(caps)


def mirror(config: QuantizeConfig) -> ExportMirror:
    """Integer weights of the same bits, group size, weight mapping and layer filter; the scheme they need a
    runtime to reproduce (:meth:`WeightQuantization.needs`)."""
    record = method(config.method)
    # The mapping is the weights' only where the method maps weights (int8_dynamic's is the activations').
    symmetric = config.mapping != "asymmetric" or record.mapping_target != "weights"
    return ExportMirror((WeightQuantization(
        method=config.method,
        bits=record.weight_bits,
        group_size=config.group_size if record.grouped else None,
        symmetric=symmetric,
        activations=record.activations,
        layer_kinds=record.layer_kinds,
        min_weight_elements=config.min_weight_elements,
        skip_head=config.skip_head,
        float_layers=tuple(config.float_layers or ()),
        no_counterpart=record.unmirrored,
    ),))


STAGE = Stage(QuantizeConfig, apply, numeric=True, mirror=mirror, requires=requires, order=30, facts=read_facts,
              rules_out=rules_out, precision=precision, after=after, short=short, libraries=("torchao",))
