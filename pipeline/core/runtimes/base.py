"""The runtime interface: how a trial's model is run for measurement and what a user deploys.

A runtime either wraps the torch module (eager, ``torch.compile``, compile + CUDA graphs) or runs a
file that an export stage writes (ONNX Runtime, OpenVINO): a :class:`FileRuntime` names that export
stage and its settings in :class:`RuntimeFile`, and the engine's runner makes the file through its
node cache (once per stage prefix) and opens it with ``RuntimeFile.open_file``. Either way the
evaluator gets a callable ``fn(*tensors) -> first output`` and measures it the same way.

Every runtime answers, before any stage of a recipe runs, whether it can run that recipe
(:meth:`Runtime.cannot_run`, from the recipe's merged :class:`~pipeline.core.mirror.ExportMirror`), so
the search rules an impossible pair out instead of paying for it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

from pipeline.core.mirror import ExportMirror
from pipeline.core.spec import Batch


class LoadedModel(Protocol):
    """An exported file opened in its runtime, called like a torch model."""

    #: Seconds the runtime took to load and compile the file (paid once, never latency).
    creation_seconds: float

    def __call__(self, *inputs: Tensor) -> Tensor:
        """The first output for torch inputs, as a float32 tensor on the caller's device."""
        ...

    def outputs(self, inputs: Batch) -> list[Tensor]:
        """All outputs, as float32 tensors on the caller's device."""
        ...

    def describe(self) -> str:
        """The settings it runs with (device or provider, threads, precision), as reports state them."""
        ...


@dataclass(frozen=True)
class RuntimeFile:
    """How a file runtime gets and opens its file: the export stage that writes it, the export-config
    fields the runtime needs on top of the pipeline's config of that stage (or the stage's defaults), and
    the function that opens the written file on a device."""

    export_stage: str
    open_file: Callable[[Path, torch.device], LoadedModel]
    settings: Mapping[str, Any] = field(default_factory=dict)


class Runtime(ABC):
    """One way to run a trial's model (see the module docstring)."""

    #: The name recipes, flags and the search use.
    name: ClassVar[str]
    #: Compiles on the first call of each input shape: that time is reported as compile time, never latency.
    compiles: ClassVar[bool] = False
    #: Needs a few fixed input shapes: sequence inputs are fed in length buckets (:mod:`pipeline.core.padding`).
    static_shapes: ClassVar[bool] = False
    #: A runtime that runs an exported file: how it gets and opens it (None: it runs the torch module).
    file: ClassVar[RuntimeFile | None] = None

    @abstractmethod
    def available(self, device: torch.device) -> bool:
        """Whether it runs on ``device`` here (read from the capability table)."""

    def label(self, device: torch.device) -> str:
        """The name as the console shows it on ``device`` (file runtimes add their provider or device)."""
        return self.name

    def cannot_run(self, mirror: ExportMirror, scripted: bool) -> str | None:
        """Why it cannot run a recipe whose numerics are ``mirror`` on a TorchScript (``scripted``) or
        ordinary model, known before any stage runs; None: it can."""
        return None

    @abstractmethod
    def prepare(self, model: nn.Module, device: torch.device) -> Callable[..., Tensor]:
        """``model`` (on ``device``, eval mode) wrapped to run; compilation is lazy."""

    def deploys(self) -> str:
        """What a user deploys from a trial under this runtime."""
        return "the torch model: `python -m pipeline apply --recipe recipe.json` rebuilds it"


class FileRuntime(Runtime):
    """A runtime that runs a file an export stage writes (the runner makes and opens it)."""

    file: ClassVar[RuntimeFile]

    def unmirrored(self, mirror: ExportMirror) -> list[str]:
        """What of a recipe's numerics the runtime's toolkit does not reproduce (empty: all of it): the gaps
        the recipe's stages name for this runtime (:class:`~pipeline.core.mirror.RuntimeGap`)."""
        return mirror.unmirrored(self.name)

    def cannot_run(self, mirror: ExportMirror, scripted: bool) -> str | None:
        if scripted:
            return (f"runtime {self.name}: its export ({self.file.export_stage}, through torch.export) cannot "
                    "trace a TorchScript module (use eager)")
        reasons = self.unmirrored(mirror)
        return f"runtime {self.name} cannot run this recipe as trained: {'; '.join(reasons)}" if reasons else None

    def prepare(self, model: nn.Module, device: torch.device) -> Callable[..., Tensor]:
        raise ValueError(f"runtime {self.name} runs an exported file, not a torch module: run the model through "
                         f"the Runner (it exports with {self.file.export_stage} and opens the file)")

    def deploys(self) -> str:
        return f"the file {self.file.export_stage} writes (the recipe names its export config)"
