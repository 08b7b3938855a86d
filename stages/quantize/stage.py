"""The quantize stage: torchao weight-only / dynamic quantization of Linear layers, or
static int8 PT2E quantization of convolutions and linears.

Methods (the records of :data:`stages.quantize.methods.METHODS`: how each is built, where it
runs and how exports mirror it):

* ``int8_weight_only``, ``int8_dynamic``, ``int4_weight_only``, ``intx_weight_only``
  (int4 weights, per group), ``float8_weight_only``, ``float8_dynamic``: torchao
  ``quantize_`` on ``nn.Linear`` layers; convolutions stay float.
* ``int8_static_pt2e``: ``torch.export`` + the x86 inductor quantizer, calibrated on the
  spec's calibration batches; quantizes convolutions and linears. The result is a
  ``GraphModule`` that is slow eager and fast under ``torch.compile`` with inductor
  freezing (see :data:`stages.quantize.static_pt2e.INDUCTOR_FREEZING_META_KEY`).

``mapping="asymmetric"`` is accepted only where the torchao config has a choice:
``intx_weight_only`` (weight mapping) and ``int8_dynamic`` (activation mapping; its
weights stay symmetric). Any other combination is rejected when the config is built,
so an invalid recipe fails before a search starts.

Layer filter (quantize_ methods and PT2E alike): the output head (the layer whose output
is the model output) when ``skip_head``; the spec's ``protected_layers`` (and modules
below them); weights with fewer than ``min_weight_elements`` elements; for the per-group
methods, layers whose input size is not a multiple of ``group_size``. The chosen and the
skipped layers are recorded as ``quantize.layers`` and ``quantize.skipped``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Self

import torch
from pydantic import Field, field_validator, model_validator
from torch import nn

from pipeline.core.device import Capabilities, move_module
from pipeline.core.errors import InfeasibleConfig, PipelineError
from pipeline.core.mirror import ExportMirror
from pipeline.core.stage import Stage, StageConfig, StageContext
from stages.quantize.layers import CONV_AND_LINEAR_TYPES, LINEAR_TYPES, LayerSelection, select_layers
from stages.quantize.methods import METHODS, method, methods_on
from stages.quantize.static_pt2e import quantize_static_pt2e, quantized_layer_names
from stages.quantize.weight_methods import quantize_linear_layers

if TYPE_CHECKING:
    import optuna

GROUP_SIZES = (32, 64, 128, 256)


class QuantizeConfig(StageConfig):
    """Quantize the model's weights (and activations, for the dynamic and static methods)."""

    stage = "quantize"

    #: A name from :data:`stages.quantize.methods.METHODS`.
    method: str
    #: Elements per quantization group along the input dimension (int4 / intx only; ignored otherwise).
    group_size: Literal[32, 64, 128, 256] = 128
    #: Symmetric or asymmetric integer mapping where the method offers the choice (see module docstring).
    mapping: Literal["symmetric", "asymmetric"] = "symmetric"
    #: Layers whose weight has fewer elements stay float.
    min_weight_elements: int = Field(default=1024, ge=0)
    #: Keep the output layer (the one producing the model output) in float.
    skip_head: bool = True

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
        and ``quantize.mapping`` only for the methods that use them."""
        name = trial.suggest_categorical("quantize.method", ["none", *methods_on(ctx.capabilities)])
        if name == "none":
            return None
        record = method(name)
        group_size = 128
        if record.grouped:
            group_size = trial.suggest_categorical("quantize.group_size", list(GROUP_SIZES))
        mapping = "symmetric"
        if record.mapping_target is not None:
            mapping = trial.suggest_categorical("quantize.mapping", ["symmetric", "asymmetric"])
        # model_validate: the values come from Optuna as plain str/int; pydantic checks them.
        return cls.model_validate({"method": name, "group_size": group_size, "mapping": mapping})


def _quantize_error(config: QuantizeConfig, what: str, exc: Exception) -> InfeasibleConfig:
    return InfeasibleConfig(f"{config.method}: {what} failed: {type(exc).__name__}: {exc}")


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
        raise _quantize_error(config, "quantization", exc) from exc
    if not layers:
        raise InfeasibleConfig(f"{config.method}: the quantizer left every layer in float ({selection.selected})")
    try:
        with torch.no_grad():
            model(*ctx.example_inputs())
    except Exception as exc:  # a quantized model whose forward fails is an infeasible trial
        raise _quantize_error(config, "forward of the quantized model", exc) from exc
    ctx.record("quantize.layers", layers)
    ctx.record("quantize.skipped", dict(selection.skipped))
    return model


def requires(config: QuantizeConfig, caps: Capabilities) -> str | None:
    """The method's kernel must exist on the device (see the method table)."""
    return method(config.method).unavailable(caps)


def mirror(config: QuantizeConfig) -> ExportMirror:
    """Integer weights of the same bits, group size, weight mapping and layer filter."""
    record = method(config.method)
    # The mapping is the weights' only where the method maps weights (int8_dynamic's is the activations').
    symmetric = config.mapping != "asymmetric" or record.mapping_target != "weights"
    return ExportMirror(
        quant_method=config.method,
        quant_bits=record.weight_bits,
        quant_group_size=config.group_size if record.grouped else None,
        quant_symmetric=symmetric,
        quant_layer_kinds=record.layer_kinds,
        quant_min_weight_elements=config.min_weight_elements,
        quant_skip_head=config.skip_head,
        quant_unmirrored=record.unmirrored,
    )


STAGE = Stage(QuantizeConfig, apply, numeric=True, mirror=mirror, requires=requires, order=30)
