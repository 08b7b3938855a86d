"""The runtime interface: how a trial's model is run for measurement and what a user deploys.

Every runtime has one shape. The engine hands :meth:`Runtime.prepare` the built model (on the device, eval
mode) and a lazy handle to the runtime's export (:class:`ExportHandle`): a runtime that runs a file (ONNX
Runtime, OpenVINO, MLX) asks the handle for it, and only then does the engine make it, through its node
cache (once per stage prefix); a runtime that wraps the torch module (eager, ``torch.compile``) never asks.
Which export a runtime reads is declared (:attr:`Runtime.export`, a :class:`RuntimeExport`), as is what
the runtime and its export reproduce of a recipe (:attr:`Runtime.reproduces`,
:class:`~paretorch.pipeline.core.runtimes.reproduces.Reproduces`): a recipe that asks for anything undeclared is
refused with the reason before any stage runs (:meth:`Runtime.cannot_run`). Either way the evaluator gets a
callable ``fn(*tensors) -> first output`` and measures it the same way.

Runtimes are found through the ``paretorch.runtimes`` entry-point group (:mod:`.registry`), like stages.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.machine_probe import DEFAULT_ENGINE, EngineProbe, torch_gains
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.runtimes.reproduces import Reproduces
from paretorch.pipeline.core.spec import Batch
from paretorch.pipeline.core.stage_context import ExportResult


@runtime_checkable
class LoadedModel(Protocol):
    """An exported file opened in its runtime, called like a torch model: what :meth:`Runtime.prepare` returns
    when it read its export (the report then states :meth:`describe` and the file's size)."""

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
class RuntimeExport:
    """The export a runtime reads: the registered export stage that writes it, and the export-config fields the
    runtime needs on top of the pipeline's config of that stage (or the stage's defaults)."""

    stage: str
    settings: Mapping[str, object] = field(default_factory=dict)


class ExportHandle(Protocol):
    """A lazy handle to the runtime's export of the model being prepared (made by the engine on first use)."""

    def result(self) -> ExportResult:
        """The export (written once per stage prefix, through the export cache); a runtime that declares no
        :attr:`Runtime.export` gets a :class:`~paretorch.pipeline.core.errors.ConfigError` saying so."""
        ...


class Runtime(ABC):
    """One way to run a trial's model (see the module docstring)."""

    #: The name recipes, flags and the search use (the entry point's name).
    name: ClassVar[str]
    #: Compiles on the first call of each input shape: that time is reported as compile time, never latency.
    compiles: ClassVar[bool] = False
    #: Needs a few fixed input shapes: sequence inputs are fed in length buckets
    #: (:mod:`paretorch.pipeline.core.padding`).
    static_shapes: ClassVar[bool] = False
    #: The export it reads through :meth:`prepare`'s handle (None: it runs the torch module itself).
    export: ClassVar[RuntimeExport | None] = None
    #: What it (and its export) reproduces of a recipe; the default, everything: it runs the built torch model.
    reproduces: ClassVar[Reproduces] = Reproduces()
    #: Whose kernels it runs: runtimes of one engine share one machine probe
    #: (:mod:`paretorch.pipeline.core.machine_probe`).
    engine: ClassVar[str] = DEFAULT_ENGINE
    #: How the short recipe notation writes it (``ort``, ``cudagraphs``; empty: its name): :meth:`short`.
    short_label: ClassVar[str] = ""
    #: The distributions whose versions change what it produces (``onnxruntime``): an evaluation under it is
    #: keyed on them (and on its export stage's), a node it does not run is not
    #: (:mod:`paretorch.pipeline.engine.cache`). torch is always keyed.
    libraries: ClassVar[tuple[str, ...]] = ()

    def probe(self, device: torch.device) -> EngineProbe:
        """Its engine's machine probe on ``device``: each reduced precision's matmul against float32, paired
        (the default: aten's products, which eager and every ``torch.compile`` runtime run)."""
        return lambda: torch_gains(device)

    @abstractmethod
    def available(self, device: torch.device) -> bool:
        """Whether it runs on ``device`` here (read from the capability table, or the toolkit's own probe)."""

    def short(self) -> str:
        """The name as the short recipe notation writes it (``prune 0.3 + int8s | ort``)."""
        return self.short_label or self.name

    def runs_torch_module(self) -> bool:
        """Whether it runs the built torch module itself (it declares no :attr:`export`): a deployment of a recipe
        can hand it the model (pack's ``PackedEncoder``), where a runtime of a file needs that file."""
        return self.export is None

    def label(self, device: torch.device) -> str:
        """The name as the console shows it on ``device`` (file runtimes add their provider or device)."""
        return self.name

    def cannot_run(self, mirror: ExportMirror, scripted: bool) -> str | None:
        """Why it cannot run a recipe whose numerics are ``mirror`` on a TorchScript (``scripted``) or ordinary
        model, known before any stage runs: what the recipe needs that :attr:`reproduces` does not declare."""
        reasons = self.reproduces.refusals(mirror, scripted)
        return f"runtime {self.name} cannot run this recipe as trained: {'; '.join(reasons)}" if reasons else None

    @abstractmethod
    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        """``model`` (on ``device``, eval mode) made runnable: wrapped (compilation is lazy), or its export
        (``export.result()``) opened; one that reads its export returns a :class:`LoadedModel`."""

    def deploys(self) -> str:
        """What a user deploys from a trial under this runtime."""
        if self.export is not None:
            return f"the file {self.export.stage} writes (the recipe names its export config)"
        return "the torch model: `python -m paretorch apply --recipe recipe.json` rebuilds it"


class GivenExport:
    """The handle to a file written before (a deployment's): the runtime opens it as it opened its trial's."""

    def __init__(self, result: ExportResult) -> None:
        self.given = result

    def result(self) -> ExportResult:
        return self.given


class NoExport:
    """The handle outside the engine (a torch model prepared on its own): a runtime that reads its export must
    run through the Runner, which makes it."""

    def __init__(self, runtime: str) -> None:
        self.runtime = runtime

    def result(self) -> ExportResult:
        raise ConfigError(f"runtime {self.runtime} runs its export: run the model through the Runner "
                          "(paretorch.pipeline.engine.runner), which makes the export and hands it over")
