"""``onnxruntime``: the ONNX export run in ONNX Runtime.

The file is the ``export.onnx`` stage's (its float graph, ORT's transformer fusions and ORT's int8
mirror of the quantize stage), opened with :func:`pipeline.core.ort_session.open_session` (the device's
first provider from the capability table). A numeric stage ONNX Runtime cannot mirror (a gap the stage
names for ``onnxruntime``, :class:`pipeline.core.mirror.RuntimeGap`) is never measured as a float model: the
search rules the recipe out before it runs, and a run that gets there anyway (``pipeline apply``) is infeasible with
the reason. The runtime measures latency itself (the export does not time it again).
"""

from __future__ import annotations

import torch

from pipeline.core.device import capabilities, ort_provider_note
from pipeline.core.ort_session import open_session
from pipeline.core.runtimes.base import FileRuntime, RuntimeFile


class OnnxRuntime(FileRuntime):
    """ONNX Runtime over the ONNX export, wherever the installed onnxruntime has a provider for the device."""

    name = "onnxruntime"
    file = RuntimeFile("export.onnx", open_session, {"measure_latency": False, "unmirrored": "infeasible"})

    def available(self, device: torch.device) -> bool:
        return bool(capabilities(device).ort_providers)

    def label(self, device: torch.device) -> str:
        if not (providers := capabilities(device).ort_providers):
            return self.name
        note = ort_provider_note(providers[0])
        return f"{self.name} ({providers[0]}{f', {note}' if note else ''})"

    def deploys(self) -> str:
        return "the .onnx file (open it with onnxruntime.InferenceSession)"


ONNXRUNTIME = OnnxRuntime()
