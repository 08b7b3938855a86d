"""``openvino``: the OpenVINO IR run in OpenVINO.

The file is the ``export.openvino`` stage's (the float graph converted with ``openvino.convert_model``,
NNCF's int8 mirror of the quantize stage, the recipe's inference precision: f32, or bf16 where the recipe's
AMP runs the whole model in bfloat16), opened with :func:`paretorch.pipeline.core.ov_session.open_ir` on the device's
first OpenVINO device from the capability table (dynamic shapes, torch's thread count, one stream, LATENCY).
What it reproduces is declared here (:data:`REPRODUCES`): a recipe needing anything else is never measured as
another model: the search rules it out before it runs, and a run that gets there anyway (``pipeline apply``,
or AMP float32 layers known only once calibrated) is infeasible with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.device import capabilities, ov_device_note
from paretorch.pipeline.core.length_groups import PACK, length_grouped
from paretorch.pipeline.core.machine_probe import EngineProbe
from paretorch.pipeline.core.mirror import quant_scheme
from paretorch.pipeline.core.ov_session import open_ir
from paretorch.pipeline.core.runtimes.base import ExportHandle, Runtime, RuntimeExport
from paretorch.pipeline.core.runtimes.openvino_probe import openvino_gains
from paretorch.pipeline.core.runtimes.reproduces import TORCHSCRIPT, Reproduces

_INT8_ONLY = ("only int8 methods have an OpenVINO mirror here (NNCF's 4-bit weight compression is not wired to "
              "the quantize stage)")

#: f32 or whole-model bf16 (INFERENCE_PRECISION_HINT); NNCF weight-only int8 (``compress_weights``, the CPU
#: plugin's dynamic quantization of activations off) and static int8 (``nncf.quantize``, calibrated).
REPRODUCES = Reproduces(
    precisions=frozenset({"float32", "bfloat16", "auto"}),
    quantization=frozenset({quant_scheme(8, "float"), quant_scheme(8, "static")}),
    groups=frozenset(),  # int8 per output channel only
    stages=frozenset({PACK}),  # the padded file called once per length group (paretorch.pipeline.core.length_groups)
    outputs=frozenset(),
    notes={
        "float16": "OpenVINO's CPU plugin runs f16 only on CPUs with native fp16 arithmetic, not wired here "
                   "(bfloat16 is)",
        "mixed": "OpenVINO's inference precision applies to the whole model (the IR's disable_fp16_compression "
                 "marks did not keep ops in float32 under the CPU's bf16)",
        quant_scheme(8, "dynamic"): "activations quantized per row at run time have no OpenVINO twin (NNCF static "
                                    "int8 calibrates fixed scales, the CPU plugin's dynamic quantization scales "
                                    "per group of input channels): int8_static_pt2e or int8_weight_only are its "
                                    "mirrors",
        quant_scheme(4, "float"): _INT8_ONLY, quant_scheme(None, "float"): _INT8_ONLY,
        TORCHSCRIPT: "its export (export.openvino) is verified on torch modules only, not on TorchScript (use eager)",
    },
)


class OpenVINORuntime(Runtime):
    """OpenVINO over the OpenVINO export, wherever the installed openvino has a device for the torch device."""

    name = "openvino"
    export = RuntimeExport("export.openvino", {"measure_latency": False, "measure_metric": False,
                                                      "unmirrored": "infeasible"})
    reproduces = REPRODUCES
    engine = "openvino"
    short_label = "ov"
    libraries = ("openvino",)

    def probe(self, device: torch.device) -> EngineProbe:
        return openvino_gains

    def available(self, device: torch.device) -> bool:
        return bool(capabilities(device).ov_devices)

    def label(self, device: torch.device) -> str:
        if not (devices := capabilities(device).ov_devices):
            return self.name
        note = ov_device_note(devices[0])
        return f"{self.name} ({devices[0]}{f', {note}' if note else ''})"

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        result = export.result()
        return length_grouped(open_ir(Path(result.path), device), result.grouped_mask_input)

    def deploys(self) -> str:
        return ("the IR directory (.xml + .bin): openvino.Core().compile_model(xml, 'CPU', "
                "{'INFERENCE_PRECISION_HINT': <the precision its rt_info records>})")


OPENVINO = OpenVINORuntime()
