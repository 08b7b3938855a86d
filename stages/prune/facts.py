"""What the prune stage knows about the unoptimized model before any trial: the blocks depth
pruning could remove (:func:`paretorch.stages.prune.depth.candidate_blocks`, one forward pass with hooks).

Prune runs first in the default pipeline, so these facts are exact for depth pruning there (no
stage adds blocks anyway); a config's own ``protected_layers`` can only remove candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from paretorch.pipeline.core.stage import StageContext
from paretorch.stages.prune.depth import candidate_blocks
from paretorch.stages.prune.model_checks import protected_modules


@dataclass(frozen=True)
class PruneFacts:
    """The blocks depth pruning could remove from the model, by name."""

    removable_blocks: tuple[str, ...]


def read_facts(model: nn.Module, ctx: StageContext) -> PruneFacts:
    """The prune facts of ``model`` on ``ctx``'s example inputs (blocks holding a spec-protected layer excluded)."""
    protected = list(protected_modules(model, ctx.spec.protected_layers).values())
    return PruneFacts(tuple(block.name for block in candidate_blocks(model, ctx.example_inputs(), protected)))
