"""``mlx``: the model run as an MLX function (Apple's array framework: Metal on Macs, CPU and CUDA on Linux).

The ``export.mlx`` stage writes the float graph as a ``torch.export`` program with the plan of MLX's own
quantization; this runtime loads it, lowers it to ``mlx.core`` ops (:mod:`paretorch_mlx.lower`), quantizes the
planned linear weights with ``mx.quantize`` and compiles the function with ``mx.compile`` (one graph per input
shape: the first call of a shape is compile time, never latency). Torch tensors in, MLX arrays through host
memory, float32 torch tensors out: the conversion is part of every measured call, as it is for a user who feeds
MLX from torch. Metal numbers are unverified until run on a Mac.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import mlx.core as mx
import torch
from torch import Tensor, nn

from paretorch.extend import Batch, EngineProbe, ExportHandle, InfeasibleConfig, Runtime, RuntimeExport
from paretorch_mlx.export import PLAN_FILE
from paretorch_mlx.lower import lower, to_mx, to_torch
from paretorch_mlx.plan import QuantPlan
from paretorch_mlx.reproduces import REPRODUCES

#: torch device type -> whether this MLX build runs there, and on which MLX device.
METAL_NOTE = "unverified: not yet run on a Mac"


def mlx_device(device: torch.device) -> mx.Device | None:
    """The MLX device for a torch device (None: this MLX build has none there): the CPU, or the GPU a Metal
    (``mps``) or CUDA (``mlx-cuda``) build drives."""
    if device.type == "cpu":
        return mx.Device(mx.cpu)
    if device.type == "mps" and mx.metal.is_available():
        return mx.Device(mx.gpu)
    if device.type == "cuda" and mx.cuda.is_available():
        return mx.Device(mx.gpu)
    return None


class MLXFunction:
    """A lowered program, compiled, called like the torch model (a
    :class:`~paretorch.extend.LoadedModel`)."""

    def __init__(self, path: Path, device: torch.device) -> None:
        start = time.perf_counter()
        extra = {PLAN_FILE: ""}
        program = torch.export.load(path, extra_files=extra)
        self.plan = QuantPlan.from_json(extra[PLAN_FILE])
        self.device = device
        where = mlx_device(device)
        if where is None:
            raise InfeasibleConfig(f"runtime mlx: this MLX build has no device for {device.type}")
        self.mx_device = where
        mx.set_default_device(where)
        self.program = lower(program, self.plan.quantize)
        self._fn = mx.compile(self.program)
        self.creation_seconds = time.perf_counter() - start

    def outputs(self, inputs: Batch) -> list[Tensor]:
        outputs = self._fn(*(to_mx(t) for t in inputs))
        mx.eval(outputs)
        return [to_torch(o, self.device).float() for o in outputs]

    def __call__(self, *inputs: Tensor) -> Tensor:
        return self.outputs(inputs)[0]

    def describe(self) -> str:
        note = f", {METAL_NOTE}" if self.device.type == "mps" else ""
        return f"MLX {metadata.version('mlx')} on {self.mx_device}{note}, mx.compile, {self.plan.describe()}"


class MLXRuntime(Runtime):
    """MLX over the ``export.mlx`` program, on the CPU and wherever the installed MLX build drives the GPU."""

    name = "mlx"
    compiles = True
    export = RuntimeExport("export.mlx")
    reproduces = REPRODUCES
    #: MLX's own kernels: no machine probe times them, so the probe judges none of its presets (trials do).
    engine = "mlx"
    libraries = ("mlx",)

    def probe(self, device: torch.device) -> EngineProbe:
        return dict

    def available(self, device: torch.device) -> bool:
        return mlx_device(device) is not None

    def label(self, device: torch.device) -> str:
        where = mlx_device(device)
        if where is None:
            return self.name
        return f"{self.name} ({where}{f', {METAL_NOTE}' if device.type == 'mps' else ''})"

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        return MLXFunction(Path(export.result().path), device)

    def deploys(self) -> str:
        return ("the .mlx.pt2 program: paretorch_mlx.runtime.MLXFunction(path, device) lowers it to MLX with its "
                "quantization plan")


MLX = MLXRuntime()
