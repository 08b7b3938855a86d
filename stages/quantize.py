"""The quantize stage: torchao weight-only / dynamic quantization of Linear layers, or
static int8 PT2E quantization of convolutions and linears.

Methods (names from :data:`pipeline.device.QUANT_METHODS`; which run on a device is the
capability table's call):

* ``int8_weight_only``, ``int8_dynamic``, ``int4_weight_only``, ``intx_weight_only``
  (int4 weights, per group), ``float8_weight_only``, ``float8_dynamic``: torchao
  ``quantize_`` on ``nn.Linear`` layers; convolutions stay float.
* ``int8_static_pt2e``: ``torch.export`` + the x86 inductor quantizer, calibrated on the
  spec's calibration batches; quantizes convolutions and linears. The result is a
  ``GraphModule`` that is slow eager and fast under ``torch.compile`` with inductor
  freezing (see :data:`stages.quantization.static_pt2e.INDUCTOR_FREEZING_META_KEY`).

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
from pydantic import Field, model_validator
from torch import nn

from pipeline.device import QuantMethod, move_module
from pipeline.errors import InfeasibleConfig, PipelineError
from stages.quantization.layers import CONV_AND_LINEAR_TYPES, LINEAR_TYPES, LayerSelection, select_layers
from stages.quantization.weight_methods import GROUPED_METHODS, MAPPING_TARGET
from stages.registry import StageConfig, StageContext, register_stage

if TYPE_CHECKING:
    import optuna

STATIC_PT2E = "int8_static_pt2e"
GROUP_SIZES = (32, 64, 128, 256)


class QuantizeConfig(StageConfig):
    """Quantize the model's weights (and activations, for the dynamic and static methods)."""

    stage = "quantize"

    method: QuantMethod
    #: Elements per quantization group along the input dimension (int4 / intx only; ignored otherwise).
    group_size: Literal[32, 64, 128, 256] = 128
    #: Symmetric or asymmetric integer mapping where the method offers the choice (see module docstring).
    mapping: Literal["symmetric", "asymmetric"] = "symmetric"
    #: Layers whose weight has fewer elements stay float.
    min_weight_elements: int = Field(default=1024, ge=0)
    #: Keep the output layer (the one producing the model output) in float.
    skip_head: bool = True

    @model_validator(mode="after")
    def _mapping_supported(self) -> Self:
        if self.mapping == "asymmetric" and self.method not in MAPPING_TARGET:
            supported = ", ".join(f"{m} ({target})" for m, target in MAPPING_TARGET.items())
            raise ValueError(
                f"mapping='asymmetric' is not supported by method='{self.method}' "
                f"(its torchao recipe fixes the mapping); asymmetric is supported by: {supported}"
            )
        return self

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """``quantize.method`` over "none" + the methods this device runs; ``quantize.group_size``
        and ``quantize.mapping`` only for the methods that use them."""
        method = trial.suggest_categorical("quantize.method", ["none", *sorted(ctx.capabilities.quant_methods)])
        if method == "none":
            return None
        group_size = 128
        if method in GROUPED_METHODS:
            group_size = trial.suggest_categorical("quantize.group_size", list(GROUP_SIZES))
        mapping = "symmetric"
        if method in MAPPING_TARGET:
            mapping = trial.suggest_categorical("quantize.mapping", ["symmetric", "asymmetric"])
        # model_validate: the values come from Optuna as plain str/int; pydantic checks them.
        return cls.model_validate({"method": method, "group_size": group_size, "mapping": mapping})


def _quantize_error(config: QuantizeConfig, what: str, exc: Exception) -> InfeasibleConfig:
    return InfeasibleConfig(f"{config.method}: {what} failed: {type(exc).__name__}: {exc}")


def _select(model: nn.Module, config: QuantizeConfig, ctx: StageContext) -> LayerSelection:
    static = config.method == STATIC_PT2E
    try:
        selection = select_layers(
            model,
            ctx.example_inputs(),
            layer_types=CONV_AND_LINEAR_TYPES if static else LINEAR_TYPES,
            min_weight_elements=config.min_weight_elements,
            skip_head=config.skip_head,
            protected=ctx.spec.protected_layers,
            group_size=config.group_size if config.method in GROUPED_METHODS else None,
        )
    except Exception as exc:  # the float model's own forward failed: not a quantization problem
        raise InfeasibleConfig(f"quantize: forward of the input model failed: {type(exc).__name__}: {exc}") from exc
    if not selection.selected:
        kinds = "Conv/Linear" if static else "Linear"
        skipped = "; ".join(f"{name}: {why}" for name, why in selection.skipped.items()) or "the model has none"
        raise InfeasibleConfig(f"{config.method}: no {kinds} layer passes the filter ({skipped})")
    return selection


@register_stage(QuantizeConfig, numeric=True)
def apply(model: nn.Module, config: QuantizeConfig, ctx: StageContext) -> nn.Module:
    """Quantize ``model`` (the runner's copy) with ``config``; raise :class:`InfeasibleConfig`
    if the method has no kernel here, no layer passes the filter, torchao rejects the model,
    or the quantized model's forward fails."""
    ctx.capabilities.require_quant(config.method)
    model = move_module(model, ctx.device).eval()
    selection = _select(model, config, ctx)
    try:
        if config.method == STATIC_PT2E:
            from stages.quantization.static_pt2e import quantize_static_pt2e, quantized_layer_names

            if not ctx.calibration_batches:
                raise InfeasibleConfig(f"{config.method} needs calibration batches; the spec's calibration() gave none")
            model = quantize_static_pt2e(model, ctx.example_inputs(), ctx.calibration_batches, selection.skipped.keys())
            layers = quantized_layer_names(model)
        else:
            from stages.quantization.weight_methods import quantize_linear_layers

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
