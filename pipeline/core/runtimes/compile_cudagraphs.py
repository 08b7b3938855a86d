"""``compile_cudagraphs``: ``torch.compile(mode="reduce-overhead")``, which records CUDA graphs.

Each call is a new CUDA-graph step (``torch.compiler.cudagraph_mark_step_begin``), so a replay never
waits on (or errors about) outputs of the previous one; callers that keep outputs must clone them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.device import capabilities
from paretorch.pipeline.core.runtimes.base import ExportHandle
from paretorch.pipeline.core.runtimes.compile import Compile


class CompileCudaGraphs(Compile):
    """torch.compile with CUDA graphs: launch overhead removed, static shapes (CUDA only)."""

    name = "compile_cudagraphs"
    short_label = "cudagraphs"
    mode = "reduce-overhead"

    def available(self, device: torch.device) -> bool:
        return capabilities(device).cuda_graphs

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        compiled = super().prepare(model, export, device)

        def run(*inputs: Tensor) -> Tensor:
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(*inputs)

        return run


COMPILE_CUDAGRAPHS = CompileCudaGraphs()
