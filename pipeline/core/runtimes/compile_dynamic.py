"""``compile_dynamic``: ``torch.compile`` (inductor, weights frozen) with the sequence length dynamic.

The ``compile`` runtime compiles one graph per input shape, so sequence inputs are padded up to
length buckets (:mod:`paretorch.pipeline.core.padding`) and the bucket's padding is paid on every call. This
runtime marks dim 1 of each token input (:func:`~paretorch.pipeline.core.token_inputs.is_token_input`: ids,
masks) dynamic, so one graph runs every batch at its own longest sample, as eager does; the batch
dim stays static (a graph per batch size, as under ``compile``). Which of the two is faster depends
on the model, the device and the lengths users send (symbolic-shape kernels can be slower than
static ones), so both are searched runtimes and measurement decides.

A model whose code fixes the sequence length (specializes the marked dim) cannot run here: dynamo's
constraint error becomes an infeasible config saying to use ``compile``, never a silent recompile
per length. CUDA graphs stay static (``compile_cudagraphs``): they record one graph per shape.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.runtimes.base import ExportHandle
from paretorch.pipeline.core.runtimes.compile import Compile, allow_bucket_graphs, known_limits_infeasible
from paretorch.pipeline.core.token_inputs import is_token_input

#: Whether this torch's ``torch.compile`` keeps a compiled module's graphs to itself (``isolate_recompiles``,
#: torch 2.12+). Without it a dynamic graph of a module could serve the static ``compile`` of the same module
#: in the process (both share the forward's code object): the runtime is not offered there (torch 2.11 raised
#: ``TypeError: compile() got an unexpected keyword argument 'isolate_recompiles'`` on every trial).
ISOLATES_RECOMPILES = "isolate_recompiles" in inspect.signature(torch.compile).parameters


def sequence_dynamic(inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """``inputs`` with dim 1 of each token input marked dynamic for dynamo, on aliases (``detach``: same
    storage), so the caller's tensors carry no mark into another compiled runtime."""
    marked = []
    for tensor in inputs:
        if is_token_input(tensor):
            tensor = tensor.detach()
            torch._dynamo.mark_dynamic(tensor, 1)
        marked.append(tensor)
    return tuple(marked)


class CompileDynamic(Compile):
    """``torch.compile`` with the sequence dim of token inputs dynamic: no length buckets."""

    name = "compile_dynamic"
    short_label = "compile-dyn"
    static_shapes = False

    def available(self, device: torch.device) -> bool:
        return ISOLATES_RECOMPILES and super().available(device)

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        if (why := self.cannot_run(ExportMirror(), isinstance(model, torch.jit.ScriptModule))) is not None:
            raise InfeasibleConfig(why)
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        allow_bucket_graphs()  # the batch dim and a packed model's token buckets stay static
        # isolate_recompiles: its graphs are its own, so ``compile`` of the same module in this process never
        # runs a dynamic graph in place of its static ones (both share the forward's code object).
        compiled = torch.compile(  # type: ignore[call-overload]  # the overloads omit isolate_recompiles
            model, mode=self.mode, dynamic=False, isolate_recompiles=True)

        def run(*inputs: Tensor) -> Tensor:
            try:
                return compiled(*sequence_dynamic(inputs))
            except ConstraintViolationError as exc:
                raise InfeasibleConfig(
                    f"runtime {self.name}: this model fixes its sequence length while tracing, so it cannot "
                    f"compile one graph for every length (use compile, which pads to length buckets): "
                    f"{str(exc).splitlines()[0]}") from exc

        return known_limits_infeasible(run, self.name)


COMPILE_DYNAMIC = CompileDynamic()
