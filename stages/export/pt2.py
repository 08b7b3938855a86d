"""The ``export.pt2`` stage: a ``torch.export`` ExportedProgram (``<spec>.pt2``) of the final
model, as the recipe left it. Not in the default pipeline (add it to a pipeline or recipe).
The machinery is :mod:`paretorch.stages.export.pt2_export`."""

from __future__ import annotations

from torch import nn

from paretorch.pipeline.core.stage import ExportConfig, ExportResult, Stage, StageContext
from paretorch.stages.export.pt2_export import export_pt2


class PT2ExportConfig(ExportConfig):
    """``torch.export`` ExportedProgram (``.pt2``) of the final model, as the recipe left it.

    * ``dynamic_batch``: a symbolic batch dimension (else fixed at the example's batch of 2).
    """

    stage = "export.pt2"

    dynamic_batch: bool = True


def apply(model: nn.Module, config: PT2ExportConfig, ctx: StageContext) -> ExportResult:
    """Export the final model to ``<spec>.pt2``."""
    return export_pt2(model, config, ctx)


STAGE = Stage(PT2ExportConfig, apply, produces="export", order=None)
