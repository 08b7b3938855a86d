"""``compile``: ``torch.compile`` (inductor) for static shapes, with weights frozen into the graph.

Inference only: freezing folds weights into the graph as constants, which the PT2E int8 kernels need
(oneDNN prepacking) and which costs nothing for float models. Dynamo reads the global flag while
tracing, so a per-call options dict is not enough. Errors of compiled code that are a known limit of a
kernel (:data:`KNOWN_COMPILED_LIMITS`) become infeasible configs with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.device import capabilities
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.runtimes.base import ExportHandle, Runtime
from paretorch.pipeline.core.runtimes.reproduces import TORCHSCRIPT, Reproduces

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


#: Graphs one compiled frame may hold before dynamo runs it eager (its default, 8, falls back silently, with a
#: warning only). The static-shape runtimes compile one graph per shape by design, bounded by the buckets (length
#: buckets of :mod:`paretorch.pipeline.core.padding`; a packed model's total-token buckets too): a replayed MiniLM pack
#: + int8
#: + bf16 recipe ran 1.85x instead of its 3.73x once its evaluation passes had compiled 8 packed shapes.
RECOMPILE_LIMIT = 64


def allow_bucket_graphs() -> None:
    """Raise dynamo's recompile limit to :data:`RECOMPILE_LIMIT`, process-wide as inductor's ``freezing`` (a
    per-call ``config.patch`` would cost a CUDA-graph call of ~0.2 ms about a tenth)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)


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


class Compile(Runtime):
    """``torch.compile(model, dynamic=False)``: one graph per input shape (sequence inputs in buckets)."""

    name = "compile"
    compiles = True
    static_shapes = True
    #: ``torch.compile``'s mode (None: the default).
    mode: ClassVar[str | None] = None

    def available(self, device: torch.device) -> bool:
        return capabilities(device).compile

    #: Any recipe's numerics (it compiles the built model), but no TorchScript.
    reproduces = Reproduces(outputs=frozenset(), notes={
        TORCHSCRIPT: "torch.compile cannot compile a TorchScript module (use eager)"})

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        if (why := self.cannot_run(ExportMirror(), isinstance(model, torch.jit.ScriptModule))) is not None:
            raise InfeasibleConfig(why)
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        allow_bucket_graphs()
        return known_limits_infeasible(torch.compile(model, mode=self.mode, dynamic=False), self.name)


COMPILE = Compile()
