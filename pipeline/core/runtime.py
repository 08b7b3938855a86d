"""How a model is run for measurement: eager, torch.compile, compile with CUDA graphs, or ONNX Runtime.

The runtime is part of a recipe and a searched dimension. Compilation happens
on the first call of each input shape; the evaluator reports that time as
``compile_seconds`` and never counts it in latency.

``onnxruntime`` runs an exported file, not the torch module: the runner makes the file with the
export stage named in :data:`EXPORTED_RUNTIMES` (through its node cache, so once per stage prefix)
and opens it with :func:`pipeline.core.ort_session.open_session`; the session's creation time is
reported apart from latency.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from pipeline.core.device import capabilities, ort_provider_note
from pipeline.core.errors import InfeasibleConfig
from pipeline.core.mirror import ExportMirror
from pipeline.core.ort_mirror import ort_unmirrored
from pipeline.core.ort_session import OrtModel, open_session

RuntimeName = Literal["eager", "compile", "compile_cudagraphs", "onnxruntime"]
RUNTIMES: tuple[RuntimeName, ...] = ("eager", "compile", "compile_cudagraphs", "onnxruntime")


@dataclass(frozen=True)
class ExportedRuntime:
    """A runtime that runs an exported file: the export stage that writes it, how it opens the file on a
    device, what of a recipe's numerics it cannot reproduce (``unmirrored``: reasons, empty when it
    reproduces all; checked before the recipe's chain runs), and the export settings the runtime needs
    (on top of the pipeline's config of that stage, or the stage's defaults)."""

    export_stage: str
    open_file: Callable[[Path, torch.device], OrtModel]
    unmirrored: Callable[[ExportMirror], list[str]]
    settings: Mapping[str, Any] = field(default_factory=dict)


#: Runtimes that run an exported file rather than the torch module. ``onnxruntime``: the ONNX export
#: (its float graph, ORT's transformer fusions and ORT's int8 mirror of the quantize stage); a numeric
#: stage it cannot mirror is never measured as a float model: a search rules the recipe out before it
#: runs (:func:`runtime_cannot_run`), and a run that gets there anyway (``pipeline apply``) is infeasible
#: with the reason. The runtime measures latency itself (the export does not time it again).
EXPORTED_RUNTIMES: dict[str, ExportedRuntime] = {
    "onnxruntime": ExportedRuntime("export.onnx", open_session, ort_unmirrored,
                                   {"measure_latency": False, "unmirrored": "infeasible"}),
}


def available_runtimes(device: torch.device) -> list[RuntimeName]:
    """Runtimes that can run on ``device`` (from the capability table)."""
    caps = capabilities(device)
    names: list[RuntimeName] = ["eager"]
    if caps.compile:
        names.append("compile")
    if caps.cuda_graphs:
        names.append("compile_cudagraphs")
    if caps.ort_providers:
        names.append("onnxruntime")
    return names


def runtime_label(runtime: str, device: torch.device) -> str:
    """``runtime`` as the console names it: ONNX Runtime with the provider it uses on ``device`` (and why
    that provider is unverified, where it is)."""
    if runtime not in EXPORTED_RUNTIMES or not (providers := capabilities(device).ort_providers):
        return runtime
    note = ort_provider_note(providers[0])
    return f"{runtime} ({providers[0]}{f', {note}' if note else ''})"


def exported_runtime(runtime: str) -> ExportedRuntime | None:
    """How ``runtime`` gets its file, or None for a runtime of the torch module."""
    return EXPORTED_RUNTIMES.get(runtime)


def runtime_cannot_run(runtime: str, mirror: ExportMirror, scripted: bool) -> str | None:
    """Why ``runtime`` cannot run a recipe whose numerics are ``mirror`` on a model that is TorchScript
    (``scripted``) or not, known before any stage of the recipe runs; None: it can. An exported runtime
    is judged with its export mirroring the recipe (``quantize="mirror"``, the export's default)."""
    exported = EXPORTED_RUNTIMES.get(runtime)
    if scripted and runtime in COMPILED_RUNTIMES:
        return f"runtime {runtime}: torch.compile cannot compile a TorchScript module (use eager)"
    if exported is None:
        return None
    if scripted:
        return (f"runtime {runtime}: its export ({exported.export_stage}, through torch.export) cannot trace a "
                "TorchScript module (use eager)")
    reasons = exported.unmirrored(mirror)
    return f"runtime {runtime} cannot run this recipe as trained: {'; '.join(reasons)}" if reasons else None


def prepare_runtime(model: nn.Module, runtime: str, device: torch.device) -> Callable[..., Tensor]:
    """Wrap ``model`` (already on ``device``) for ``runtime``; compilation is lazy."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime '{runtime}': choose one of {', '.join(RUNTIMES)}")
    if runtime not in available_runtimes(device):
        raise InfeasibleConfig(f"runtime {runtime} is not available on {device.type}")
    if runtime == "eager":
        return model
    if runtime in EXPORTED_RUNTIMES:
        raise ValueError(f"runtime {runtime} runs an exported file, not a torch module: run the model through "
                         f"the Runner (it exports with {EXPORTED_RUNTIMES[runtime].export_stage} and opens the file)")
    if (why := runtime_cannot_run(runtime, ExportMirror(), isinstance(model, torch.jit.ScriptModule))) is not None:
        raise InfeasibleConfig(why)
    # Inference only: freezing folds weights into the graph as constants, which the
    # PT2E int8 kernels need (onednn prepacking) and which costs nothing for float models.
    # Dynamo reads the global flag while tracing, so a per-call options dict is not enough.
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    mode = "reduce-overhead" if runtime == "compile_cudagraphs" else None
    compiled: Callable[..., Tensor] = known_limits_infeasible(torch.compile(model, mode=mode, dynamic=False), runtime)
    if runtime == "compile_cudagraphs":
        return _graph_steps(compiled)
    return compiled


#: Errors of compiled code that are a known limit of a kernel, not a bug: (message
#: fragment, what it means for the user). Raised as :class:`InfeasibleConfig`.
KNOWN_COMPILED_LIMITS = (
    (
        "needs to be greater than 16",
        "torchao's int8 dynamic matmul compiles to torch._int_mm, which on CUDA needs more than 16 rows "
        "(batch x sequence) per matmul and this input has fewer: run int8_dynamic in eager, use a larger "
        "batch, or int8_weight_only",
    ),
)


def known_limits_infeasible(fn: Callable[..., Tensor], runtime: str) -> Callable[..., Tensor]:
    """``fn`` whose errors matching :data:`KNOWN_COMPILED_LIMITS` become infeasible configs
    with the known reason (other errors pass through unchanged)."""

    def run(*inputs: Tensor) -> Tensor:
        try:
            return fn(*inputs)
        except RuntimeError as exc:
            for fragment, reason in KNOWN_COMPILED_LIMITS:
                if fragment in str(exc):
                    raise InfeasibleConfig(f"runtime {runtime}: {reason} ({str(exc).splitlines()[0]})") from exc
            raise

    return run


def _graph_steps(compiled: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Each call is a new CUDA-graph step, so a replay never waits on (or errors about)
    outputs of the previous one; callers that keep outputs must clone them."""

    def run(*inputs: Tensor) -> Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*inputs)

    return run


#: Runtimes that compile the torch module on the first call of each input shape.
COMPILED_RUNTIMES: frozenset[str] = frozenset({"compile", "compile_cudagraphs"})


def is_compiled(runtime: str) -> bool:
    return runtime in COMPILED_RUNTIMES


#: Runtimes compiled for static shapes (``torch.compile(dynamic=False)``, CUDA graphs): every new
#: input shape compiles (and records) anew, so sequence inputs are fed in length buckets
#: (:mod:`pipeline.core.padding`), as one serves such a model.
STATIC_SHAPE_RUNTIMES: frozenset[str] = frozenset({"compile", "compile_cudagraphs"})


def needs_static_shapes(runtime: str) -> bool:
    """Whether ``runtime`` needs a few fixed input shapes (sequence inputs padded to length buckets)."""
    return runtime in STATIC_SHAPE_RUNTIMES
