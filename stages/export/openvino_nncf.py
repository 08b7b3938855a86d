"""NNCF, the OpenVINO mirror of the quantize stage, and the layers it touches.

The recipe's quantize method decides the NNCF call (which ones OpenVINO mirrors:
:data:`paretorch.pipeline.core.runtimes.openvino.REPRODUCES`):
static int8 (PT2E, calibrated) -> ``nncf.quantize`` calibrated on the spec's calibration data one sample per
NNCF item (token samples cut to their own length: no padding token's activation widens a range), every
sample used, preset MIXED (asymmetric activations, symmetric per-channel weights: the x86 PT2E recipe's
uint8 affine activations and int8 symmetric weights), NNCF's overflow fix off (the PT2E recipe's full 8-bit
weights) on every CPU, those without VNNI included (:func:`quantize_static` says why), with NNCF's transformer
model type for token models: the parameters sentence-transformers' OpenVINO backend (optimum-intel's
``OVQuantizationConfig``) quantizes with; int8
weight-only -> ``nncf.compress_weights`` (INT8, per output channel) with the CPU plugin's dynamic
activation quantization off. The layers are the ones the torch side quantized: the quantize stage's layer
filter (:class:`~paretorch.stages.export.layer_filter.LayerFilter`) read on each weighted op of the IR, every other
weighted op in NNCF's ignored scope.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import Batch
from paretorch.pipeline.core.token_inputs import is_token_input
from paretorch.stages.export.checks import converter_failure
from paretorch.stages.export.layer_filter import LayerFilter, module_weight_key

if TYPE_CHECKING:
    import openvino

#: IR op types of the layer kinds a quantization touches (what NNCF quantizes or compresses there).
OV_OP_TYPES = {"linear": ("MatMul",), "conv": ("Convolution", "GroupConvolution")}
#: Ops with a constant weight that NNCF may quantize or compress (embeddings: Gather).
WEIGHTED_OP_TYPES = frozenset({"MatMul", "Convolution", "GroupConvolution", "Gather"})
#: Ops that pass a layer's output on unchanged enough that the layer still counts as the head.
PASS_THROUGH_OPS = frozenset({"Add", "Convert", "Reshape"})
#: Prefix of the friendly names the PyTorch frontend gives ops of a module: ``__module.<path>/aten::...``.
MODULE_PREFIX = "__module."

OvQuantMode = Literal["static", "weights"]
NNCFModelType = Literal["transformer", "default"]


@dataclass(frozen=True)
class WeightedOp:
    """An IR op with a constant weight: its name, the torch module it came from (None: not traceable, e.g.
    a convolution with a folded BatchNorm), weight shape, kind and whether it produces the output."""

    name: str
    module: str | None
    shape: tuple[int, ...]
    op_type: str
    is_head: bool


def _constant_shape(node: openvino.Node) -> tuple[int, ...] | None:
    """The shape of ``node`` when it is a constant (through Convert / Reshape), else None."""
    while node.get_type_name() in ("Convert", "Reshape") and node.get_input_size() > 0:
        node = node.input_value(0).get_node()
    if node.get_type_name() != "Constant":
        return None
    return tuple(int(d) for d in node.get_output_shape(0))


def _module_of(node: openvino.Node) -> str | None:
    name = node.get_friendly_name()
    if not name.startswith(MODULE_PREFIX):
        return None
    return name[len(MODULE_PREFIX):].split("/", 1)[0]


def _feeds_output(node: openvino.Node) -> bool:
    for target in node.output(0).get_target_inputs():
        consumer = target.get_node()
        if consumer.get_type_name() == "Result":
            return True
        if consumer.get_type_name() in PASS_THROUGH_OPS and _feeds_output(consumer):
            return True
    return False


def weighted_ops(model: openvino.Model) -> list[WeightedOp]:
    """Every op of ``model`` with a constant weight (second input; Gather: its data), in graph order."""
    found = []
    for node in model.get_ordered_ops():
        op_type = node.get_type_name()
        if op_type not in WEIGHTED_OP_TYPES or node.get_input_size() < 2:
            continue
        weight_index = 0 if op_type == "Gather" else 1
        shape = _constant_shape(node.input_value(weight_index).get_node())
        if shape is not None:
            found.append(WeightedOp(node.get_friendly_name(), _module_of(node), shape, op_type, _feeds_output(node)))
    return found


@dataclass(frozen=True)
class LayerSelection:
    """Which weighted ops NNCF touches (``selected``), the rest (``ignored``, with why), and the layers the
    filter names (protected, kept float) that no op could be traced to."""

    selected: tuple[str, ...]
    ignored: dict[str, str]
    untraced: tuple[str, ...]


def select_ops(model: openvino.Model, layer_filter: LayerFilter) -> LayerSelection:
    """The ops of the IR the quantize stage's filter quantizes; everything else weighted is ignored."""
    op_types = {op for kind in layer_filter.kinds for op in OV_OP_TYPES[kind]}
    selected: list[str] = []
    ignored: dict[str, str] = {}
    traced: set[str] = set()
    for op in weighted_ops(model):
        if op.op_type not in op_types:
            ignored[op.name] = f"{op.op_type}: a layer kind the torch side did not quantize"
            continue
        key = module_weight_key(f"{op.module}.weight") if op.module else module_weight_key(op.name)
        reason = layer_filter.skip_reason(key, elements=math.prod(op.shape),
                                          input_size=op.shape[1] if len(op.shape) > 1 else op.shape[0],
                                          is_head=op.is_head)
        if reason is None:
            selected.append(op.name)
        else:
            ignored[op.name] = reason
            if op.module:
                traced.update(layer for layer in (*layer_filter.protected, *layer_filter.float_layers)
                              if op.module == layer or op.module.startswith(f"{layer}."))
    named = (*layer_filter.protected, *layer_filter.float_layers)
    return LayerSelection(tuple(selected), ignored, tuple(layer for layer in named if layer not in traced))


def nncf_quiet() -> contextlib.AbstractContextManager[object]:
    """NNCF's progress bars (printed to stdout) and info logs dropped; its warnings still reach the log."""
    import nncf

    nncf.set_log_level(logging.WARNING)
    return contextlib.redirect_stdout(io.StringIO())


def calibration_samples(calibration: Sequence[Batch], padding_mask: int | None) -> list[Batch]:
    """The calibration batches as single samples (NNCF's statistics are per item: a batch of 32 would be one
    sample of its ranges), each cut to its own length (right padding, the mask's real tokens) when the spec has a
    ``padding_mask`` input."""
    samples: list[Batch] = []
    for batch in calibration:
        for row in range(int(batch[0].shape[0])):
            sample = tuple(t[row : row + 1] for t in batch)
            if padding_mask is not None:
                length = max(1, int(sample[padding_mask].ne(0).sum()))
                sample = tuple(t[:, :length] if is_token_input(t) else t for t in sample)
            samples.append(sample)
    return samples


def quantize_static(model: openvino.Model, ignored: Sequence[str], calibration: Sequence[Batch],
                    model_type: NNCFModelType, padding_mask: int | None = None) -> openvino.Model:
    """``nncf.quantize`` of ``model`` (a copy is quantized: NNCF changes the model it is given) on the
    spec's calibration data, one sample per item (:func:`calibration_samples`), every one used, overflow fix
    off, ``ignored`` op names left float.

    The overflow fix (7-bit weights) stays off on CPUs without VNNI too. Their u8 x s8 kernels add pairs of products
    in int16 and can saturate, but real weights rarely reach it: on an AVX2-only EPYC (Zen 3), all-mpnet-base-v2's
    static int8 left 34.0 % of 2,910 dev sentences below cosine 0.9 to fp32 with the fix off (33.8 % on an AVX-512
    VNNI host, where nothing saturates) and 78.7 % with it on (half the weight levels on every layer). ONNX
    Runtime's MLAS is another matter: it saturates on real weights (``stages/export/onnx_int8.py``)."""
    import nncf

    samples = calibration_samples(calibration, padding_mask)
    if not samples:
        raise InfeasibleConfig("static int8 in OpenVINO needs calibration batches: the spec has none")
    dataset = nncf.Dataset(samples, lambda batch: tuple(t.detach().cpu().numpy() for t in batch))
    try:
        with nncf_quiet():
            return nncf.quantize(
                model.clone(), dataset, preset=nncf.QuantizationPreset.MIXED,
                model_type=nncf.ModelType.TRANSFORMER if model_type == "transformer" else None,
                subset_size=len(samples), target_device=nncf.TargetDevice.CPU,
                ignored_scope=nncf.IgnoredScope(names=list(ignored), validate=False),
                advanced_parameters=nncf.AdvancedQuantizationParameters(overflow_fix=nncf.OverflowFix.DISABLE),
            )
    except InfeasibleConfig:
        raise
    except Exception as exc:  # NNCF raises many types (nncf.ValidationError, RuntimeError, OpenVINO's)
        raise converter_failure("NNCF static int8 quantization", exc) from exc


def compress_weights(model: openvino.Model, ignored: Sequence[str], symmetric: bool) -> openvino.Model:
    """``nncf.compress_weights`` INT8 (per output channel, ``symmetric`` or not) of every weighted op but
    ``ignored``; activations stay float (the loader keeps the CPU's dynamic quantization off)."""
    import nncf

    mode = nncf.CompressWeightsMode.INT8_SYM if symmetric else nncf.CompressWeightsMode.INT8_ASYM
    try:
        with nncf_quiet():
            return nncf.compress_weights(model.clone(), mode=mode,
                                         ignored_scope=nncf.IgnoredScope(names=list(ignored), validate=False))
    except Exception as exc:  # NNCF raises many types
        raise converter_failure("NNCF int8 weight compression", exc) from exc


#: Ops a MatMul input passes through on its way from a FakeQuantize or an int8 constant (reshapes, the weight's
#: decompression: Convert, Subtract of the zero point, Multiply by the scale).
QUANT_PATH_OPS = frozenset({"Convert", "Reshape", "Transpose", "Subtract", "Multiply"})


def _int8_source(node: openvino.Node, depth: int = 4) -> str | None:
    """``activation`` when ``node`` is (or is fed, through :data:`QUANT_PATH_OPS`, by) a FakeQuantize, ``weight``
    when by an int8 / uint8 constant, else None."""
    op_type = node.get_type_name()
    if op_type == "FakeQuantize":
        return "activation"
    if op_type == "Constant":
        return "weight" if node.get_element_type().get_type_name() in ("i8", "u8") else None
    if op_type not in QUANT_PATH_OPS or depth == 0:
        return None
    found = {_int8_source(node.input_value(i).get_node(), depth - 1) for i in range(node.get_input_size())}
    return "activation" if "activation" in found else "weight" if "weight" in found else None


@dataclass(frozen=True)
class MatMulPrecision:
    """The MatMuls of an IR by what reaches them int8: ``int8`` (an int8 weight and a quantized activation),
    ``weight_only`` (an int8 weight, a float activation), ``float`` (no int8 weight: the attention's
    activation-by-activation MatMuls and any layer NNCF left float); friendly names of the last two."""

    int8: int
    weight_only: tuple[str, ...]
    float: tuple[str, ...]


def matmul_precision(model: openvino.Model) -> MatMulPrecision:
    """Which MatMuls of ``model`` NNCF's static int8 reaches (``ScaledDotProductAttention`` ops are no MatMul)."""
    int8 = 0
    weight_only: list[str] = []
    floats: list[str] = []
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul":
            continue
        sources = {_int8_source(node.input_value(i).get_node()) for i in range(2)}
        if sources == {"activation", "weight"}:
            int8 += 1
        elif "weight" in sources:
            weight_only.append(node.get_friendly_name())
        else:
            floats.append(node.get_friendly_name())
    return MatMulPrecision(int8, tuple(weight_only), tuple(floats))


def count_int8(model: openvino.Model) -> tuple[int, int]:
    """(FakeQuantize ops, int8 / uint8 constants) of ``model``: what NNCF inserted."""
    fake_quantize = int8_constants = 0
    for node in model.get_ops():
        if node.get_type_name() == "FakeQuantize":
            fake_quantize += 1
        elif node.get_type_name() == "Constant" and node.get_element_type().get_type_name() in ("i8", "u8"):
            int8_constants += 1
    return fake_quantize, int8_constants
