"""``openvino``: the OpenVINO IR run in OpenVINO.

The file is the ``export.openvino`` stage's (the float graph converted with ``openvino.convert_model``,
NNCF's int8 mirror of the quantize stage, the recipe's inference precision: f32, or bf16 where the recipe's
AMP runs the whole model in bfloat16), opened with :func:`pipeline.core.ov_session.open_ir` on the device's
first OpenVINO device from the capability table (dynamic shapes, torch's thread count, one stream, LATENCY).
A numeric stage OpenVINO cannot mirror (a gap the stage names for ``openvino``,
:class:`pipeline.core.mirror.RuntimeGap`) is never measured as another model: the search rules the recipe
out before it runs, and a run that gets there anyway (``pipeline apply``, or AMP float32 layers known only
once calibrated) is infeasible with the reason.
"""

from __future__ import annotations

import torch

from pipeline.core.device import capabilities, ov_device_note
from pipeline.core.mirror import ExportMirror
from pipeline.core.ov_session import open_ir
from pipeline.core.runtimes.base import FileRuntime, RuntimeFile


class OpenVINORuntime(FileRuntime):
    """OpenVINO over the OpenVINO export, wherever the installed openvino has a device for the torch device."""

    name = "openvino"
    file = RuntimeFile("export.openvino", open_ir, {"measure_latency": False, "unmirrored": "infeasible"})

    def available(self, device: torch.device) -> bool:
        return bool(capabilities(device).ov_devices)

    def label(self, device: torch.device) -> str:
        if not (devices := capabilities(device).ov_devices):
            return self.name
        note = ov_device_note(devices[0])
        return f"{self.name} ({devices[0]}{f', {note}' if note else ''})"

    def cannot_run(self, mirror: ExportMirror, scripted: bool) -> str | None:
        if scripted:
            return (f"runtime {self.name}: its export ({self.file.export_stage}) is verified on torch modules only, "
                    "not on TorchScript (use eager)")
        reasons = self.unmirrored(mirror)
        return f"runtime {self.name} cannot run this recipe as trained: {'; '.join(reasons)}" if reasons else None

    def deploys(self) -> str:
        return ("the IR directory (.xml + .bin): openvino.Core().compile_model(xml, 'CPU', "
                "{'INFERENCE_PRECISION_HINT': <the precision its rt_info records>})")


OPENVINO = OpenVINORuntime()
