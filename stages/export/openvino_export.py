"""OpenVINO export: ``openvino.convert_model`` of the float graph, NNCF's int8 mirror, validation and metrics.

The float graph is converted from the torch model (the PyTorch frontend traces it; the ExportedProgram
route of openvino 2026.4 fails on torch 2.13's guard function), with every input's batch and, for token
inputs, sequence dimension dynamic. The recipe's numeric stages are then re-applied with OpenVINO's tools
(:mod:`paretorch.stages.export.openvino_nncf`; which ones it can, the runtime declares:
:data:`paretorch.pipeline.core.runtimes.openvino.REPRODUCES`), and the IR is saved with float32
weights (``save_model`` would otherwise halve them to float16, a numeric change of its own). The artifact is a directory
``<spec>.openvino`` holding ``<spec>.xml`` + ``<spec>.bin``; the IR's ``rt_info`` records the inference
precision, the recipe and the library versions, and keeps OpenVINO's dynamic activation quantization off
(``runtime_options``, which ``compile_model`` applies). The IR is checked against torch at two shapes (the
traced one and another batch and length) and measured with OpenVINO on the CPU.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.ov_session import InferencePrecision, default_precision, open_ir, record_settings
from paretorch.pipeline.core.padding import cut_to, longest, trim_to_longest
from paretorch.pipeline.core.runtimes.openvino import OPENVINO
from paretorch.pipeline.core.spec import Batch, ModelSpec
from paretorch.pipeline.core.stage import ExportResult, StageContext, export_mirror
from paretorch.pipeline.core.token_inputs import is_token_input
from paretorch.stages.common.mirror_facts import ReducedPrecision, WeightQuantization
from paretorch.stages.export.atomic import artifact_size_bytes, atomic_artifact
from paretorch.stages.export.checks import (
    CPU,
    compare_outputs,
    converter_failure,
    cpu_inputs,
    file_measures,
    float_graph_on_cpu,
    grouped_mask_input,
    grouped_note,
    require_close,
    run_reference,
)
from paretorch.stages.export.layer_filter import LayerFilter
from paretorch.stages.export.metadata import artifact_metadata
from paretorch.stages.export.openvino_nncf import (
    NNCFModelType,
    OvQuantMode,
    compress_weights,
    count_int8,
    quantize_static,
    select_ops,
)

if TYPE_CHECKING:
    import openvino

    from paretorch.stages.export.openvino import OpenVINOExportConfig

#: The IR's ``runtime_options`` that ``openvino.Core.compile_model`` applies by itself (a plain user's load
#: gets them): dynamic activation quantization off, so int8 weight-only keeps float activations.
RUNTIME_OPTIONS = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
#: Metric-name prefix of the export's own measurements.
PREFIX = "openvino"


@dataclass(frozen=True)
class OvPlan:
    """What the export does to the float IR: quantize (``mode``, None: nothing), at which precision."""

    mode: OvQuantMode | None
    precision: InferencePrecision
    model_type: NNCFModelType
    notes: tuple[str, ...]


def ov_plan(config: OpenVINOExportConfig, upstream: ExportMirror, token_model: bool,
            device_default: InferencePrecision = "f32") -> OvPlan:
    """Decide the NNCF step and the precision from ``config`` and the recipe (``device_default``: the precision
    OpenVINO picks by itself on the device, :func:`~paretorch.pipeline.core.ov_session.default_precision`); with
    ``config.unmirrored == "infeasible"`` a numeric stage OpenVINO cannot reproduce raises
    :class:`InfeasibleConfig`."""
    exported = upstream if config.quantize == "mirror" else upstream.without(WeightQuantization)
    reasons = OPENVINO.reproduces.refusals(exported)
    amp, quant = upstream.of(ReducedPrecision), upstream.of(WeightQuantization)
    whole_model_bf16 = amp is not None and amp.dtype in ("bfloat16", "auto") and not amp.fp32_layers
    static_int8 = config.quantize == "mirror" and quant is not None and quant.bits == 8 \
        and quant.activations == "static"
    notes: list[str] = []
    precision: InferencePrecision
    if config.inference_precision == "auto":
        precision = "bf16" if whole_model_bf16 else device_default if static_int8 and amp is None else "f32"
        if static_int8 and amp is None and precision == "bf16":
            notes.append("the float ops around the int8 MatMuls run in bf16: OpenVINO's own inference precision "
                         "on this CPU, as sentence-transformers' OpenVINO + NNCF int8 runs (the torch recipe "
                         "keeps them in float32)")
    else:
        precision = config.inference_precision
        if amp is not None and precision == "f32":
            reasons.append(f"AMP ({amp.dtype}) is not mirrored: inference_precision='f32'")
    if reasons and config.unmirrored == "infeasible":
        raise InfeasibleConfig(f"OpenVINO cannot run this recipe as trained: {'; '.join(reasons)} "
                               "(run it with a torch runtime, or change the recipe)")
    notes += [f"not mirrored: {why}" for why in reasons]
    model_type: NNCFModelType = ("transformer" if token_model else "default") if config.model_type == "auto" \
        else config.model_type
    mode: OvQuantMode | None = None
    if config.quantize == "mirror" and quant is not None and quant.bits == 8:
        if quant.activations == "static":
            mode = "static"
        elif quant.activations == "float":
            mode = "weights"
    elif config.quantize == "none" and quant is not None:
        notes.append("not quantized (quantize='none')")
    return OvPlan(mode, precision, model_type, tuple(notes))


def export_openvino(model: nn.Module, config: OpenVINOExportConfig, ctx: StageContext) -> ExportResult:
    """Write ``<spec>.openvino/`` (IR ``.xml`` + ``.bin``) under ``ctx.output_dir``, validated with OpenVINO."""
    import openvino

    output_dir = ctx.require_output_dir()
    upstream = export_mirror(ctx.upstream)
    float_model = float_graph_on_cpu(model, ctx)
    traced, other = check_inputs(ctx.spec)
    plan = ov_plan(config, upstream, any(is_token_input(t) for t in traced), default_precision(CPU))
    ctx.resolve(type(config).model_validate({**config.model_dump(), "inference_precision": plan.precision,
                                             "model_type": plan.model_type}))
    references = [run_reference(float_model, inputs) for inputs in (traced, other)]
    notes = [f"converted with openvino.convert_model (PyTorch frontend), dynamic shapes, {plan.precision} "
             "inference precision", *plan.notes]
    graph = _convert(float_model, traced)
    if plan.mode is not None:
        graph = _quantize(graph, plan, upstream, ctx, notes)
    name = f"{ctx.spec.name}.openvino"
    with atomic_artifact(output_dir, name) as staged:
        staged.mkdir()
        xml = staged / f"{ctx.spec.name}.xml"
        metadata = artifact_metadata(ctx.upstream, "openvino", "nncf")
        record_settings(graph, {"inference_precision": plan.precision, "recipe": metadata["paretorch.recipe"],
                                "versions": metadata["paretorch.versions"]})
        for key, value in RUNTIME_OPTIONS.items():
            graph.set_rt_info(value, ["runtime_options", key])
        openvino.save_model(graph, str(xml), compress_to_fp16=False)
        runner = open_ir(xml, CPU)
        lossy = plan.mode is not None or plan.precision != "f32"
        comparisons = [compare_outputs(ref, runner.outputs(inputs)) for ref, inputs in zip(references, (traced, other),
                                                                                         strict=True)]
        worst = min(comparisons, key=lambda c: c.cosine) if lossy else max(comparisons, key=lambda c: c.max_abs_error)
        notes.append(require_close(worst, lossy=lossy, what=f"OpenVINO ({runner.describe()}), at 2 shapes,",
                                   spec=ctx.spec))
        metrics = {f"{PREFIX}_max_abs_error": worst.max_abs_error, f"{PREFIX}_cosine": worst.cosine}
        metrics.update(file_measures(runner, ctx, PREFIX, config.measure_metric, config.measure_latency,
                                     ctx.timed_batch_sizes()))
    path = output_dir / name
    grouped_input = grouped_mask_input(upstream, ctx.spec)
    return ExportResult(format="openvino", path=path, size_bytes=artifact_size_bytes(path),
                        validation="; ".join([*notes, *grouped_note(grouped_input)]), metrics=metrics,
                        grouped_mask_input=grouped_input)


def check_inputs(spec: ModelSpec) -> tuple[Batch, Batch]:
    """The traced inputs (batch 2, padded to their longest) and a second shape to check the IR's dynamic
    dimensions on (batch 3; token inputs cut shorter)."""
    traced, other = cpu_inputs(spec, 2), cpu_inputs(spec, 3)
    if spec.padding_mask is not None:
        traced = trim_to_longest(traced, spec.padding_mask)
        other = cut_to(other, max(1, longest(other, spec.padding_mask) // 2), spec.padding_mask)
    return traced, other


def _convert(model: nn.Module, inputs: Batch) -> openvino.Model:
    """The float IR, every dimension dynamic (the frontend's default with an example input)."""
    import openvino

    try:
        with warnings.catch_warnings():
            # The tracer warns about Python branches on shapes; the IR is checked at a second shape instead.
            warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
            return openvino.convert_model(model, example_input=inputs)
    except Exception as exc:  # the frontend raises OpConversionFailure, RuntimeError, torch errors
        raise converter_failure("OpenVINO conversion (openvino.convert_model)", exc) from exc


def _quantize(graph: openvino.Model, plan: OvPlan, upstream: ExportMirror, ctx: StageContext,
              notes: list[str]) -> openvino.Model:
    """The NNCF mirror of the recipe's int8 on the layers its filter chose; ``notes`` gets what it did."""
    quant = upstream.of(WeightQuantization)
    if quant is None:
        raise ValueError("an OpenVINO int8 plan needs the recipe's quantization (ov_plan gave a mode without one)")
    layer_filter = LayerFilter.from_upstream(upstream, ctx.spec.protected_layers, default_min_elements=0)
    selection = select_ops(graph, layer_filter)
    if selection.untraced:
        why = f"layers the quantize filter keeps float not traced to an IR op: {', '.join(selection.untraced)}"
        raise InfeasibleConfig(f"OpenVINO cannot mirror {quant.method}: {why}")
    if not selection.selected:
        notes.append(f"int8 not applied: no op of the IR passes the quantize filter ({len(selection.ignored)} float)")
        return graph
    if plan.mode == "static":
        calibration = ctx.spec.calibration()
        quantized = quantize_static(graph, list(selection.ignored), calibration, plan.model_type,
                                    ctx.spec.padding_mask)
        samples = sum(int(batch[0].shape[0]) for batch in calibration)
        how = (f"{quant.method} mirrored: NNCF static int8 (preset MIXED: asymmetric activations, "
               f"symmetric per-channel weights; model type {plan.model_type}; overflow fix off), calibrated on "
               f"the spec's {samples} calibration samples, one per NNCF item")
    else:
        quantized = compress_weights(graph, list(selection.ignored), quant.symmetric)
        mapping = "symmetric" if quant.symmetric else "asymmetric"
        how = (f"{quant.method} mirrored: NNCF int8 weight compression ({mapping}, per output channel), "
               "activations float (dynamic quantization off)")
    fake_quantize, int8_constants = count_int8(quantized)
    notes.append(f"{how}: {len(selection.selected)} layers int8 ({fake_quantize} FakeQuantize, {int8_constants} int8 "
                 f"constants), {len(selection.ignored)} weighted ops float")
    return quantized

