"""Convert a float torch model to a Core ML ML Program, trying several routes.

Routes, in order (the first that converts wins; the notes say which one):

1. ``torch.export`` + ``run_decompositions({})`` (what coremltools recommends;
   keeps ``linear`` / ``conv`` as single ops);
2. ``torch.export`` + the core ATen decompositions, keeping ``aten.linear``
   (coremltools lacks converters for some non-core ops, e.g. ``new_ones`` in
   Hugging Face BERT);
3. ``torch.jit.trace`` (models ``torch.export`` cannot capture).

The compute precision follows the recipe's AMP policy: float32 without AMP;
float16 with it, keeping the AMP stage's fp32 layers in float32 where their ops
can be found in the exported graph (:class:`Fp32LayerSelector`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import Batch
from paretorch.stages.common.mirror_facts import ReducedPrecision
from paretorch.stages.export.checks import short_error

if TYPE_CHECKING:
    import coremltools as ct
    from coremltools.converters.mil.mil import Operation
    from torch.export.decomp_utils import CustomDecompTable

    from paretorch.stages.export.coreml import CoreMLExportConfig

PLAIN_ROUTE = "torch.export"
CORE_ATEN_ROUTE = "torch.export + core ATen decompositions"
TRACE_ROUTE = "torch.jit.trace"


def convert_float_graph(
    ct: ModuleType, model: nn.Module, inputs: Batch, config: CoreMLExportConfig, amp: ReducedPrecision | None
) -> tuple[ct.models.MLModel, list[str]]:
    """The converted ML Program and notes: the route taken (and why earlier routes failed) and the precision."""
    options = {
        "convert_to": "mlprogram",
        "minimum_deployment_target": getattr(ct.target, config.minimum_deployment_target),
        "compute_units": getattr(ct.ComputeUnit, config.compute_units),
    }
    failures: list[str] = []
    try:
        exported = torch.export.export(model, inputs)
    except Exception as exc:  # torch.export raises many types; the traced route may still work
        failures.append(f"{PLAIN_ROUTE}: {short_error(exc)}")
    else:
        decompositions: list[tuple[str, Callable[[], torch.export.ExportedProgram]]] = [
            (PLAIN_ROUTE, lambda: exported.run_decompositions({})),
            (CORE_ATEN_ROUTE, lambda: exported.run_decompositions(_core_aten_keeping_linear())),
        ]
        for route, decompose in decompositions:
            try:
                program = decompose()
                selector = Fp32LayerSelector(program, amp.fp32_layers if amp is not None else ())
                mlmodel = ct.convert(program, compute_precision=compute_precision(ct, amp, selector), **options)
            except Exception as exc:  # coremltools raises NotImplementedError/ValueError/...: try the next route
                failures.append(f"{route}: {short_error(exc)}")
                continue
            return mlmodel, [_route_note(route, failures), precision_note(amp, selector)]
    try:
        traced = torch.jit.trace(model, inputs)
        precision = compute_precision(ct, amp, None)
        mlmodel = ct.convert(
            traced, inputs=_traced_input_types(ct, model, inputs), compute_precision=precision, **options
        )
    except Exception as exc:
        failures.append(f"{TRACE_ROUTE}: {short_error(exc)}")
        raise InfeasibleConfig("Core ML conversion failed: " + "; ".join(failures)) from exc
    return mlmodel, [_route_note(TRACE_ROUTE, failures), precision_note(amp, None)]


def _core_aten_keeping_linear() -> CustomDecompTable:
    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.linear.default, None)
    return table


def _route_note(route: str, failures: list[str]) -> str:
    note = f"converted from {route}"
    return f"{note} (failed before: {'; '.join(failures)})" if failures else note


def _traced_input_types(ct: ModuleType, model: nn.Module, inputs: Batch) -> list[ct.TensorType]:

    names = [p for p in inspect.signature(model.forward).parameters if p not in ("self", "args", "kwargs")]
    if len(names) != len(inputs):
        names = [f"input_{index}" for index in range(len(inputs))]
    return [
        ct.TensorType(name=name, shape=tuple(t.shape), dtype=np.float32 if t.is_floating_point() else np.int32)
        for name, t in zip(names, inputs, strict=True)
    ]


class Fp32LayerSelector:
    """FP16ComputePrecision op selector that keeps the ops of the AMP stage's fp32
    layers in float32. Layers are found through the exported graph's
    ``nn_module_stack``; ops are matched by the FX node names coremltools reuses."""

    def __init__(self, exported: torch.export.ExportedProgram | None, layers: tuple[str, ...]) -> None:
        self.layers = layers
        self.node_layer: dict[str, str] = {}
        if exported is not None:
            for node in exported.graph.nodes:
                paths = [entry[0] for entry in (node.meta.get("nn_module_stack") or {}).values()]
                for layer in layers:
                    if any(p == layer or p.startswith(layer + ".") for p in paths):
                        self.node_layer[node.name] = layer
        self.matched: set[str] = set()

    def __call__(self, op: Operation) -> bool:
        """True: cast this op to float16; False: keep it in float32."""
        if op.op_type == "const":  # constants follow the ops that read them
            return True
        for candidate in (op.name, *(v.name for v in op.outputs)):
            layer = self._layer_of(candidate)
            if layer is not None:
                self.matched.add(layer)
                return False
        return True

    def _layer_of(self, name: str) -> str | None:
        if name in self.node_layer:
            return self.node_layer[name]
        # coremltools derives helper names as "<node>_<suffix>"; "<node>_<digit>" is another node.
        for node, layer in self.node_layer.items():
            rest = name[len(node) + 1 :]
            if name.startswith(node + "_") and rest and not rest[0].isdigit():
                return layer
        return None


def compute_precision(ct: ModuleType, amp: ReducedPrecision | None, selector: Fp32LayerSelector | None) -> object:
    """FLOAT32 without AMP; FLOAT16, or float16 with an fp32 op selector, with it."""
    if amp is None:
        return ct.precision.FLOAT32
    if amp.fp32_layers and selector is not None and selector.node_layer:
        return ct.transform.FP16ComputePrecision(op_selector=selector)
    return ct.precision.FLOAT16


def precision_note(amp: ReducedPrecision | None, selector: Fp32LayerSelector | None) -> str:
    """Plain words for the precision used, including fp32 layers that could not be kept."""
    if amp is None:
        return "compute float32 (no AMP in the recipe)"
    note = "compute float16"
    if amp.dtype != "float16":
        note += f" (AMP {amp.dtype}: Core ML computes in float16 or float32 only)"
    if not amp.fp32_layers:
        return note
    kept = sorted(selector.matched) if selector is not None else []
    missing = [layer for layer in amp.fp32_layers if layer not in kept]
    if kept:
        note += f"; kept in float32: {', '.join(kept)}"
    if missing:
        note += f"; fp32 layers not found in the converted graph, float16 there: {', '.join(missing)}"
    return note
