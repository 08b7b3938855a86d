"""``onnxruntime``: the ONNX export run in ONNX Runtime.

The file is the ``export.onnx`` stage's (its float graph, ORT's transformer fusions and ORT's int8
mirror of the quantize stage), opened with :func:`paretorch.pipeline.core.ort_session.open_session` (the device's
first provider from the capability table). What it reproduces is declared here (:data:`REPRODUCES`): a recipe
needing anything else is never measured as a float model: the search rules it out before it runs, and a run
that gets there anyway (``pipeline apply``) is infeasible with the reason (the export reads the same
declaration). The runtime measures latency itself (the export does not time it again).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.device import capabilities, ort_provider_note
from paretorch.pipeline.core.length_groups import PACK, length_grouped
from paretorch.pipeline.core.machine_probe import EngineProbe
from paretorch.pipeline.core.mirror import quant_scheme
from paretorch.pipeline.core.ort_session import open_session
from paretorch.pipeline.core.runtimes.base import ExportHandle, Runtime, RuntimeExport
from paretorch.pipeline.core.runtimes.onnxruntime_probe import onnxruntime_gains
from paretorch.pipeline.core.runtimes.reproduces import TORCHSCRIPT, Reproduces

_FLOAT32_GRAPH = "ONNX Runtime runs the exported float32 graph: the recipe's reduced precision is not mirrored"
_INT8_ONLY = "only int8 methods have an ONNX Runtime mirror here"

#: Float32 graphs with ORT's dynamic or static (QDQ, calibrated) int8 (:mod:`paretorch.stages.export.onnx_int8`).
REPRODUCES = Reproduces(
    precisions=frozenset({"float32"}),
    quantization=frozenset({quant_scheme(8, "dynamic"), quant_scheme(8, "static")}),
    groups=frozenset(),  # int8 per output channel only
    stages=frozenset({PACK}),  # the padded file called once per length group (paretorch.pipeline.core.length_groups)
    outputs=frozenset(),
    notes={
        "bfloat16": _FLOAT32_GRAPH, "float16": _FLOAT32_GRAPH, "auto": _FLOAT32_GRAPH, "mixed": _FLOAT32_GRAPH,
        quant_scheme(8, "float"): "weight-only int8 keeps activations float, and ONNX Runtime's int8 kernels "
                                  "quantize them too (int8_dynamic is its mirror)",
        quant_scheme(4, "float"): _INT8_ONLY, quant_scheme(None, "float"): _INT8_ONLY,
        TORCHSCRIPT: "its export (export.onnx, through torch.export) cannot trace a TorchScript module (use eager)",
    },
)


class OnnxRuntime(Runtime):
    """ONNX Runtime over the ONNX export, wherever the installed onnxruntime has a provider for the device."""

    name = "onnxruntime"
    export = RuntimeExport("export.onnx", {"measure_latency": False, "measure_metric": False,
                                                      "unmirrored": "infeasible"})
    reproduces = REPRODUCES
    engine = "onnxruntime"
    short_label = "ort"
    libraries = ("onnxruntime",)

    def probe(self, device: torch.device) -> EngineProbe:
        return onnxruntime_gains

    def available(self, device: torch.device) -> bool:
        return bool(capabilities(device).ort_providers)

    def label(self, device: torch.device) -> str:
        if not (providers := capabilities(device).ort_providers):
            return self.name
        note = ort_provider_note(providers[0])
        return f"{self.name} ({providers[0]}{f', {note}' if note else ''})"

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        result = export.result()
        return length_grouped(open_session(Path(result.path), device), result.grouped_mask_input)

    def deploys(self) -> str:
        return "the .onnx file (open it with onnxruntime.InferenceSession)"


ONNXRUNTIME = OnnxRuntime()
