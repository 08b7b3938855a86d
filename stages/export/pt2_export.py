"""ExportedProgram export: ``torch.export`` of the final model (quantized / AMP as the recipe made it).

Unlike Core ML and ONNX, nothing is mirrored: the program holds exactly the
model the recipe produced, on ``ctx.device`` (a program exported on a GPU
replays there). The recipe and library versions travel as extra files
(``paretorch.recipe.json``, ``paretorch.versions.json``) inside the ``.pt2``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from paretorch.pipeline.core.device import move_module
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import Batch
from paretorch.pipeline.core.stage import ExportResult, StageContext
from paretorch.stages.export.atomic import artifact_size_bytes, atomic_artifact
from paretorch.stages.export.checks import (
    compare_outputs,
    converter_failure,
    flatten_outputs,
    require_close,
    run_reference,
)
from paretorch.stages.export.metadata import RECIPE_KEY, VERSIONS_KEY, artifact_metadata

if TYPE_CHECKING:
    from paretorch.stages.export.pt2 import PT2ExportConfig

#: Batch size of the traced example; a dynamic batch dimension is checked at another size too.
EXAMPLE_BATCH = 2
CHECK_BATCH = 3


def extra_file_name(key: str) -> str:
    """Name of the extra file inside the ``.pt2`` that holds metadata ``key``."""
    return f"{key}.json"


def export_pt2(model: nn.Module, config: PT2ExportConfig, ctx: StageContext) -> ExportResult:
    """Write ``<spec name>.pt2`` (``torch.export.save``) and check that it reloads and matches."""
    output_dir = ctx.require_output_dir()
    model = move_module(model, ctx.device).eval()
    inputs = ctx.example_inputs(EXAMPLE_BATCH)
    dynamic_shapes = None
    if config.dynamic_batch:
        batch = torch.export.Dim("batch", min=1)
        dynamic_shapes = tuple({0: batch} if t.dim() > 0 else None for t in inputs)
    try:
        exported = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    except Exception as exc:  # torch.export raises many types (UserError, Unsupported, ...)
        raise converter_failure("torch.export of the model", exc) from exc
    metadata = artifact_metadata(ctx.upstream)
    name = f"{ctx.spec.name}.pt2"
    with atomic_artifact(output_dir, name) as staged:
        try:
            torch.export.save(exported, staged, extra_files={extra_file_name(k): v for k, v in metadata.items()})
        except Exception as exc:  # pickling of tensor subclasses can fail here
            raise converter_failure("torch.export.save", exc) from exc
        checked = _check_reload(staged, model, ctx, inputs, config.dynamic_batch)
    path = output_dir / name
    shape_note = "dynamic batch" if config.dynamic_batch else f"fixed batch {EXAMPLE_BATCH}"
    return ExportResult(
        format="pt2",
        path=path,
        size_bytes=artifact_size_bytes(path),
        validation=f"torch.export of the final model ({shape_note}); reloaded with torch.export.load; {checked}",
        metrics={},
    )


def _check_reload(path: Path, model: nn.Module, ctx: StageContext, inputs: Batch, dynamic: bool) -> str:
    extra = {extra_file_name(RECIPE_KEY): "", extra_file_name(VERSIONS_KEY): ""}
    try:
        loaded = torch.export.load(path, extra_files=extra).module()
    except Exception as exc:
        raise converter_failure("torch.export.load", exc) from exc
    if not extra[extra_file_name(RECIPE_KEY)]:
        raise InfeasibleConfig("the reloaded .pt2 lost its recipe")
    checks = [inputs, ctx.example_inputs(CHECK_BATCH)] if dynamic else [inputs]
    parts = []
    for batch in checks:
        with torch.no_grad():
            raw = flatten_outputs(model(*batch))
        lossy = any(t.dtype != torch.float32 for t in raw if t.is_floating_point())
        reference = [t.detach().to("cpu", torch.float32) for t in raw]
        comparison = compare_outputs(reference, run_reference(loaded, batch))
        require_close(comparison, lossy, "the reloaded program")
        parts.append(f"batch {int(batch[0].shape[0])}: {comparison.describe()}")
    return "outputs match the model (" + "; ".join(parts) + ")"
