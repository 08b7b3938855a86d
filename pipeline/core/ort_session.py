"""An ONNX file run with onnxruntime like a torch model: ``model(*tensors) -> first output``.

The one place that opens onnxruntime sessions, so the ``onnxruntime`` runtime and the ONNX
export's own check run a file alike: the first execution provider of the capability table for
the device (:data:`paretorch.pipeline.core.device.ORT_PROVIDERS`), all of onnxruntime's graph optimizations
(``ORT_ENABLE_ALL``, also what a plain ``onnxruntime.InferenceSession(path)`` applies), and as many
intra-op threads as torch uses (``torch.get_num_threads()``), sequential execution, no spinning
between calls (a spinning pool would take the CPU from the torch model timed in the same rounds).
Torch tensors go in, through numpy, and come back as float32 tensors on the caller's device.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from paretorch.pipeline.core.device import capabilities, ort_provider_note
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import Batch

if TYPE_CHECKING:
    import numpy
    import onnxruntime

#: onnxruntime's graph optimization level the sessions use (its name in ``onnxruntime.GraphOptimizationLevel``).
GRAPH_OPTIMIZATION = "ORT_ENABLE_ALL"
#: Session config entries: intra-op threads sleep between calls instead of spinning.
SESSION_CONFIG = {"session.intra_op.allow_spinning": "0"}
#: Longest onnxruntime message quoted in a reason.
MAX_MESSAGE_CHARS = 300


@dataclass(frozen=True)
class SessionSettings:
    """How a session runs: provider, threads and optimization level (stated in every report)."""

    provider: str
    intra_op_threads: int
    graph_optimization: str = GRAPH_OPTIMIZATION

    def describe(self) -> str:
        note = ort_provider_note(self.provider)
        return (f"onnxruntime {self.provider}{f' ({note})' if note else ''}, {self.intra_op_threads} intra-op "
                f"thread(s) (= torch's), {self.graph_optimization}")


def session_settings(device: torch.device, threads: int | None = None) -> SessionSettings:
    """The settings for ``device``: its first onnxruntime provider, ``threads`` (default: torch's count)."""
    providers = capabilities(device).ort_providers
    if not providers:
        raise InfeasibleConfig(f"onnxruntime has no execution provider for {device.type} in this install "
                               "(the capability table lists none): use a torch runtime here")
    return SessionSettings(providers[0], threads if threads is not None else torch.get_num_threads())


def _message(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else '(no message)'}"
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def open_session(path: Path, device: torch.device, fixed_batch: int | None = None,
                 threads: int | None = None) -> OrtModel:
    """``path`` loaded in onnxruntime with :func:`session_settings`; a file onnxruntime cannot load is
    an infeasible config with its message. The creation time is kept on the model (not latency)."""
    import onnxruntime

    settings = session_settings(device, threads)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, settings.graph_optimization)
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    for key, value in SESSION_CONFIG.items():
        options.add_session_config_entry(key, value)
    start = time.perf_counter()
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=[settings.provider])
    except Exception as exc:  # onnxruntime's own exception types (Fail, InvalidGraph, NotImplemented ...)
        raise InfeasibleConfig(f"onnxruntime cannot load {path.name}: {_message(exc)}") from exc
    return OrtModel(session, settings, device, fixed_batch, time.perf_counter() - start)


class OrtModel:
    """Calls an onnxruntime session like a torch model: ``model(*tensors) -> first output``.

    With a fixed batch size, inputs are run in chunks of that size (the last one padded by
    repeating its final row) and the outputs trimmed back.
    """

    def __init__(self, session: onnxruntime.InferenceSession, settings: SessionSettings, device: torch.device,
                 fixed_batch: int | None = None, creation_seconds: float = 0.0) -> None:
        self.session = session
        self.settings = settings
        self.device = device
        self.input_names = [i.name for i in session.get_inputs()]
        self.fixed_batch = fixed_batch
        #: Seconds onnxruntime took to load and optimize the file (paid once per session, not latency).
        self.creation_seconds = creation_seconds

    def outputs(self, inputs: Batch) -> list[Tensor]:
        """All outputs as float32 tensors on the model's device."""
        if len(inputs) != len(self.input_names):
            raise InfeasibleConfig(f"the ONNX graph takes {len(self.input_names)} inputs, the spec gives {len(inputs)}")
        if self.fixed_batch is None:
            return self._run(inputs)
        rows = int(inputs[0].shape[0])
        chunks: list[list[Tensor]] = []
        for start in range(0, rows, self.fixed_batch):
            chunk = tuple(_pad_rows(t[start : start + self.fixed_batch], self.fixed_batch) for t in inputs)
            chunks.append([out[: min(self.fixed_batch, rows - start)] for out in self._run(chunk)])
        return [torch.cat(parts) for parts in zip(*chunks, strict=True)]

    def __call__(self, *inputs: Tensor) -> Tensor:
        return self.outputs(inputs)[0]

    def describe(self) -> str:
        """Provider, threads and optimization level, as reports state them."""
        return self.settings.describe()

    def _run(self, inputs: Sequence[Tensor]) -> list[Tensor]:
        feed: dict[str, numpy.ndarray] = {
            name: t.detach().cpu().numpy() for name, t in zip(self.input_names, inputs, strict=True)
        }
        try:
            results = self.session.run(None, feed)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise InfeasibleConfig(f"onnxruntime inference failed: {_message(exc)}") from exc
        return [torch.from_numpy(result).to(self.device, torch.float32) for result in results]


def _pad_rows(tensor: Tensor, rows: int) -> Tensor:
    missing = rows - int(tensor.shape[0])
    if missing <= 0:
        return tensor
    return torch.cat([tensor, tensor[-1:].expand(missing, *tensor.shape[1:])])
