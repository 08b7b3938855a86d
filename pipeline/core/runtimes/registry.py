"""The runtimes, by name: one line per runtime module; names are validated here and nowhere else."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from pipeline.core.errors import InfeasibleConfig
from pipeline.core.names import unknown_runtime
from pipeline.core.runtimes.base import Runtime
from pipeline.core.runtimes.compile import COMPILE
from pipeline.core.runtimes.compile_cudagraphs import COMPILE_CUDAGRAPHS
from pipeline.core.runtimes.compile_dynamic import COMPILE_DYNAMIC
from pipeline.core.runtimes.eager import EAGER
from pipeline.core.runtimes.onnxruntime import ONNXRUNTIME
from pipeline.core.runtimes.openvino import OPENVINO

#: Every runtime, in the order the console lists them.
RUNTIMES: dict[str, Runtime] = {runtime.name: runtime for runtime in (
    EAGER,
    COMPILE,
    COMPILE_DYNAMIC,
    COMPILE_CUDAGRAPHS,
    ONNXRUNTIME,
    OPENVINO,
)}


def runtime_names() -> tuple[str, ...]:
    return tuple(RUNTIMES)


def get_runtime(name: str) -> Runtime:
    """The runtime called ``name``; an unknown name is a :class:`ConfigError` that lists the known ones."""
    try:
        return RUNTIMES[name]
    except KeyError:
        raise unknown_runtime(name) from None


def available_runtimes(device: torch.device) -> list[str]:
    """Names of the runtimes that run on ``device`` here."""
    return [name for name, runtime in RUNTIMES.items() if runtime.available(device)]


def prepare_runtime(model: nn.Module, name: str, device: torch.device) -> Callable[..., Tensor]:
    """``model`` (already on ``device``) wrapped for the runtime called ``name``; one that does not run on
    ``device`` here is an :class:`InfeasibleConfig`."""
    runtime = get_runtime(name)
    if not runtime.available(device):
        raise InfeasibleConfig(f"runtime {name} is not available on {device.type}")
    return runtime.prepare(model, device)
