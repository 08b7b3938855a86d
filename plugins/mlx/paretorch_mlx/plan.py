"""Which linear weights MLX quantizes for a recipe, and how: the quantize stage's method mapped to MLX's own affine
quantization (``mx.quantize``: ``bits`` per weight, one scale and bias per group of ``group_size`` inputs).

The recipe's :class:`~paretorch.extend.WeightQuantization` says the bits and, for per-group methods,
the group size; a per-channel method (int8 weight-only) is quantized in MLX's groups (the export's ``group_size``, 64
by default as ``mlx.nn.quantize``), so its numerics are MLX's, not torchao's per-channel symmetric ones: the trial's
metric is measured on MLX's outputs. The layers are the quantize stage's (its layer filter, read by
:class:`~paretorch.extend.LayerFilter` as every export reads it); MLX has no quantized convolution,
so convolutions stay float.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from paretorch.extend import ExportMirror, LayerFilter, WeightQuantization, module_weight_key
from paretorch_mlx.lower import QuantizedLinear
from paretorch_mlx.reproduces import GROUP_SIZES

#: Ops between a linear layer and the program's output that keep it the output head.
_PASS_THROUGH = {"aten.view.default", "aten.reshape.default", "aten.clone.default", "aten._unsafe_view.default"}


@dataclass(frozen=True)
class QuantPlan:
    """Linear weights (parameter names) MLX quantizes with their scheme, and why the others stay float."""

    quantize: dict[str, QuantizedLinear] = field(default_factory=dict)
    kept_float: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"quantize": {k: asdict(v) for k, v in self.quantize.items()},
                           "kept_float": self.kept_float}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> QuantPlan:
        data = json.loads(text) if text else {}
        return cls({k: QuantizedLinear(**v) for k, v in data.get("quantize", {}).items()},
                   dict(data.get("kept_float", {})))

    def describe(self) -> str:
        if not self.quantize:
            return "float32"
        schemes = sorted({f"int{q.bits} g{q.group_size}" for q in self.quantize.values()})
        kept = len(self.kept_float)
        return f"{len(self.quantize)} linear weight(s) MLX-quantized ({', '.join(schemes)}), {kept} float"


def quant_plan(program: ExportedProgram, mirror: ExportMirror, protected: tuple[str, ...],
               default_group: int) -> QuantPlan:
    """The plan for the recipe ``mirror`` over the linear layers of ``program`` (``protected``: the spec's
    layers); an MLX group size the recipe cannot use is a ValueError."""
    quant = mirror.of(WeightQuantization)
    if quant is None or quant.bits is None:
        return QuantPlan()
    group = quant.group_size or default_group
    if group not in GROUP_SIZES:
        raise ValueError(f"MLX quantizes in groups of {', '.join(map(str, GROUP_SIZES))}, not {group}")
    layer_filter = LayerFilter.from_upstream(mirror, protected, default_min_elements=0)
    graph = program.graph
    targets = {s.arg.name: s.target for s in program.graph_signature.input_specs
               if s.kind == InputKind.PARAMETER and s.target is not None}
    state = program.state_dict
    quantize: dict[str, QuantizedLinear] = {}
    kept: dict[str, str] = {}
    for node in graph.nodes:
        if node.op != "call_function" or str(node.target) != "aten.linear.default":
            continue
        weight = node.args[1]
        target = targets.get(weight.name) if isinstance(weight, torch.fx.Node) else None
        if target is None:
            continue
        out_features, in_features = state[target].shape
        why = layer_filter.skip_reason(module_weight_key(target), elements=out_features * in_features,
                                       input_size=in_features, is_head=_feeds_output(node))
        if why is None and in_features % group:
            why = f"input size {in_features} is not a multiple of MLX's group size {group}"
        if why is None:
            quantize[target] = QuantizedLinear(bits=quant.bits, group_size=group)
        else:
            kept[target] = why
    return QuantPlan(quantize, kept)


def _feeds_output(node: torch.fx.Node) -> bool:
    return any(user.op == "output" or (str(user.target) in _PASS_THROUGH and _feeds_output(user))
               for user in node.users)
