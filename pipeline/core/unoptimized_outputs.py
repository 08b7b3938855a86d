"""The unoptimized model's outputs on the evaluation batches, computed once per batch for everyone who reads them.

Several readers need the unoptimized model's outputs on the same rows: a study's reference (its self-check's first
scoring and the baseline's evaluation, :mod:`paretorch.pipeline.core.self_check`), the fidelity metrics of a scored
spec (:mod:`paretorch.pipeline.core.task_spec`), a proxy metric's cap (:mod:`paretorch.pipeline.core.proxy_metric`),
a fidelity floor's rows (:mod:`paretorch.pipeline.core.fidelity_floor`) and a spec scored on fidelity alone
(:func:`paretorch.pipeline.core.fidelity.fidelity_spec`, whose targets are these outputs). A spec holds one
:class:`UnoptimizedOutputs` (``ModelSpec.unoptimized``, shared by every spec derived from it with the same
``build``): each reader asks it for its batches; a batch already run (by any reader, on the study's device or the
CPU) is not run again. Batches are known by identity: a spec's ``evaluation()`` hands out the same batch objects on
every call, so a study runs the unoptimized model over its evaluation set once (a test counts the forward rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.progress import phase

#: A forward's inputs (``paretorch.pipeline.core.spec.Batch``; spec.py builds on this module).
_Inputs = tuple[Tensor, ...]


class UnoptimizedOutputs:
    """The outputs of ``build()``'s model (eval mode, float32, on the CPU) per input batch, computed on first use or
    provided by a reader that ran the same model over the batch (:meth:`provide`)."""

    def __init__(self, build: Callable[[], nn.Module]) -> None:
        self.build = build
        #: id(batch) -> (the batch, kept alive so its id stays its own; its outputs)
        self._known: dict[int, tuple[_Inputs, Tensor]] = {}

    def has(self, batches: Sequence[_Inputs]) -> bool:
        """Whether every batch's outputs are known."""
        return all(id(batch) in self._known for batch in batches)

    def provide(self, batch: _Inputs, outputs: Tensor) -> None:
        """Record ``outputs`` (the unoptimized model's on ``batch``, on any device) unless already known."""
        self._known.setdefault(id(batch), (batch, outputs.detach().float().cpu()))

    def of(self, batches: Sequence[_Inputs]) -> Tensor:
        """The outputs on ``batches``, concatenated in their order; the batches not yet known run now."""
        missing = list({id(batch): batch for batch in batches if id(batch) not in self._known}.values())
        if missing:  # the model is not kept: a large model's second copy would stay for the whole study
            for batch, outputs in zip(missing, reference_outputs(self.build(), missing), strict=True):
                self.provide(batch, outputs)
        return torch.cat([self._known[id(batch)][1] for batch in batches])


def reference_outputs(model: nn.Module, batches: Sequence[_Inputs]) -> list[Tensor]:
    """``model``'s outputs on ``batches`` (eval mode, CPU, float32, no grad), one pass with a progress line."""
    model = model.eval()
    outputs = []
    with torch.inference_mode(), phase(f"reference outputs of the unoptimized model ({len(batches)} batches)",
                                       total=len(batches)) as shown:
        for batch in batches:
            output = model(*batch)
            if not isinstance(output, Tensor):
                raise SpecError(f"the model returned {type(output).__name__}, not a tensor; fidelity needs one tensor")
            outputs.append(output.detach().float().cpu().clone())
            shown.advance()
    return outputs
