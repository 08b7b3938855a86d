"""Mirror a recipe's compression onto a converted Core ML model with ``coremltools.optimize.coreml``.

The mapping (torch recipe -> Core ML weight compression):

* int8 methods -> ``linear_quantize_weights`` int8 per output channel,
  ``linear_symmetric`` or ``linear`` (asymmetric) as the recipe's weight mapping;
* int4 / intx -> int4 per-block quantization (block = the recipe's group size)
  when the deployment target is iOS18 / macOS15 or later, else 4-bit k-means
  palettization (per-block int4 needs the iOS18 opset);
* float8 methods -> not mirrored (Core ML has no float8 weights);
* unstructured pruning -> the zeros the pruning left are stored sparse
  (``prune_weights`` with a tiny threshold: exactly the torch zeros); combined
  with quantization only from iOS18 / macOS15 (joint compression);
* ``palettize_bits`` -> ``palettize_weights`` on every weight still uncompressed.

Quantization touches the weights the quantize stage chose
(:mod:`paretorch.stages.export.layer_filter`), selected by constant name. Sparse
storage and palettization follow coremltools' size rule: weights with no more
than ``weight_threshold`` elements stay as they are (coremltools' default 2048).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.stages.common.mirror_facts import Sparsity, WeightQuantization
from paretorch.stages.export.layer_filter import LayerFilter, module_weight_key, untraced_protected

if TYPE_CHECKING:
    import coremltools as ct
    from coremltools.converters.mil.mil import Operation

#: Deployment targets whose opset has per-block int4 and joint compression (iOS18 opset).
IOS18_TARGETS = frozenset({"iOS18", "macOS15"})
#: A weight is stored sparse only when at least this fraction of it is zero.
SPARSE_MIN_FRACTION = 0.1
#: Default int4 block size when the recipe gives no group size.
DEFAULT_INT4_BLOCK = 32
#: MIL op types of each layer kind of the layer filter.
MIL_OP_TYPES = {"linear": ("linear",), "conv": ("conv",)}
#: Producers of a weight the quantization may compress: a plain constant, or one already
#: stored sparse (then compressed jointly); coremltools names the latter "<const>_sparsified".
WEIGHT_PRODUCERS = frozenset({"const", "constexpr_sparse_to_dense"})
SPARSE_SUFFIX = "_sparsified"
#: Ops that pass a layer's output on unchanged enough that the layer still counts as the head.
PASS_THROUGH_OPS = frozenset({"cast", "add", "reshape", "identity"})


@dataclass
class WeightSelection:
    """Weight constants of the converted program the mirrored quantization compresses, and the others."""

    selected: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def mirror_compression(
    mlmodel: ct.models.MLModel,
    upstream: ExportMirror,
    layer_filter: LayerFilter,
    target: str,
    weight_threshold: int,
    palettize_bits: int | None,
) -> tuple[ct.models.MLModel, list[str]]:
    """Apply the recipe's compression (and ``palettize_bits``) to ``mlmodel``;
    returns the new model and one plain note per decision."""
    import coremltools.optimize.coreml as cto

    notes: list[str] = []
    joint = target in IOS18_TARGETS
    quant = upstream.of(WeightQuantization)
    sparse = upstream.of(Sparsity) is not None
    if sparse and (joint or quant is None or quant.bits is None):
        mlmodel = _store_zeros_sparse(cto, mlmodel, weight_threshold)
        notes.append("zeros of the unstructured pruning stored sparse")
    if quant is not None and quant.bits is not None:
        selection = select_weights(mlmodel, layer_filter)
        mlmodel, note = _quantize(cto, mlmodel, quant, selection, target, joint_with_sparse=sparse and joint)
        notes.append(note)
        untraced = untraced_protected(layer_filter, list(selection.skipped.values()))
        if untraced:
            notes.append(f"protected layers not traced to a Core ML weight: {', '.join(untraced)}")
        if sparse and not joint:
            mlmodel = _store_zeros_sparse(cto, mlmodel, weight_threshold)
            notes.append(f"sparse storage only where not quantized ({target}: joint compression needs iOS18/macOS15)")
    elif quant is not None:
        why = quant.no_counterpart or "no integer weights to store"
        notes.append(f"{quant.method} not mirrored: {why}")
    if palettize_bits is not None:
        config = cto.OpPalettizerConfig(nbits=palettize_bits, mode="kmeans", weight_threshold=weight_threshold)
        mlmodel = cto.palettize_weights(mlmodel, cto.OptimizationConfig(global_config=config))
        notes.append(f"palettized to {palettize_bits} bits (weights the recipe left uncompressed)")
    return mlmodel, notes


def select_weights(mlmodel: ct.models.MLModel, layer_filter: LayerFilter) -> WeightSelection:
    """The weight constants of the filter's layer kinds, split by the filter."""
    program = getattr(mlmodel, "_mil_program", None)
    if program is None:
        raise InfeasibleConfig("the converted Core ML model has no MIL program to compress (not an ML Program?)")
    main = program.functions["main"]
    outputs = {var.name for var in main.outputs}
    op_types = {t for kind in layer_filter.kinds for t in MIL_OP_TYPES[kind]}
    selection = WeightSelection()
    for op in main.operations:
        weight = op.inputs.get("weight") if op.op_type in op_types else None
        if weight is None or weight.op is None or weight.op.op_type not in WEIGHT_PRODUCERS or weight.shape is None:
            continue
        producer = weight.op
        shape = tuple(int(d) for d in weight.shape)
        reason = layer_filter.skip_reason(
            module_weight_key(producer.name.removesuffix(SPARSE_SUFFIX)),
            elements=math.prod(shape),
            input_size=shape[1] if len(shape) > 1 else shape[0],
            is_head=_feeds_output(op, outputs),
        )
        if reason is None:
            selection.selected.append(producer.name)
        else:
            selection.skipped[producer.name] = reason
    return selection


def _feeds_output(op: Operation, outputs: set[str]) -> bool:
    for var in op.outputs:
        if var.name in outputs:
            return True
        for child in var.child_ops:
            if child.op_type in PASS_THROUGH_OPS and any(out.name in outputs for out in child.outputs):
                return True
    return False


def _quantize(
    cto: ModuleType,
    mlmodel: ct.models.MLModel,
    quant: WeightQuantization,
    selection: WeightSelection,
    target: str,
    joint_with_sparse: bool,
) -> tuple[ct.models.MLModel, str]:
    method = quant.method
    if not selection.selected:
        return mlmodel, f"{method} not mirrored: no weight passes the quantize filter ({_skips(selection)})"
    mode = "linear_symmetric" if quant.symmetric else "linear"
    which = f"{len(selection.selected)} weights; float: {_skips(selection)}"
    if quant.bits == 8:
        op_config = cto.OpLinearQuantizerConfig(mode=mode, dtype="int8", granularity="per_channel", weight_threshold=0)
        note = f"{method} mirrored: int8 per-channel {mode} ({which})"
    elif target in IOS18_TARGETS:
        block = quant.group_size or DEFAULT_INT4_BLOCK
        op_config = cto.OpLinearQuantizerConfig(
            mode=mode, dtype="int4", granularity="per_block", block_size=block, weight_threshold=0
        )
        note = f"{method} mirrored: int4 per-block ({block}) {mode} ({which})"
    else:
        op_config = cto.OpPalettizerConfig(nbits=4, mode="kmeans", weight_threshold=0)
        config = cto.OptimizationConfig(op_name_configs=dict.fromkeys(selection.selected, op_config))
        note = f"{method} mirrored as 4-bit palettization, per-block int4 needs iOS18/macOS15 ({which})"
        return cto.palettize_weights(mlmodel, config), note
    config = cto.OptimizationConfig(op_name_configs=dict.fromkeys(selection.selected, op_config))
    return cto.linear_quantize_weights(mlmodel, config, joint_compression=joint_with_sparse), note


def _skips(selection: WeightSelection) -> str:
    return ", ".join(f"{name} ({why})" for name, why in selection.skipped.items()) or "none"


def _store_zeros_sparse(cto: ModuleType, mlmodel: ct.models.MLModel, weight_threshold: int) -> ct.models.MLModel:
    config = cto.OpThresholdPrunerConfig(
        threshold=1e-12, minimum_sparsity_percentile=SPARSE_MIN_FRACTION, weight_threshold=weight_threshold
    )
    return cto.prune_weights(mlmodel, cto.OptimizationConfig(global_config=config))


def compressed_weight_ops(mlmodel: ct.models.MLModel) -> dict[str, int]:
    """Count of compressed-weight ops (``constexpr_*``) in the model's functions, by op type."""
    program = mlmodel.get_spec().mlProgram
    counts: Counter[str] = Counter()
    for function in program.functions.values():
        for block in function.block_specializations.values():
            counts.update(op.type for op in block.operations if op.type.startswith("constexpr_"))
    return dict(sorted(counts.items()))
