"""The ``export.mlx`` stage: the float graph as a ``torch.export`` program (``<spec>.mlx.pt2``) with the plan of
MLX's own quantization of the recipe (:mod:`paretorch_mlx.plan`), checked by lowering it to MLX
(:mod:`paretorch_mlx.lower`) and comparing the outputs with torch at two batch sizes (and, for token inputs, two
lengths). Not in the default pipeline: the ``mlx`` runtime reads it through its export handle.
"""

from __future__ import annotations

from typing import Literal

import mlx.core as mx
import torch
from torch import nn

from paretorch.extend import (
    Batch,
    ExportConfig,
    ExportResult,
    InfeasibleConfig,
    Stage,
    StageContext,
    WeightQuantization,
    artifact_metadata,
    artifact_size_bytes,
    atomic_artifact,
    compare_outputs,
    converter_failure,
    export_mirror,
    is_token_input,
    move_module,
    require_close,
    run_reference,
)
from paretorch_mlx.lower import UnsupportedOps, lower, to_mx, to_torch
from paretorch_mlx.plan import QuantPlan, quant_plan
from paretorch_mlx.reproduces import REPRODUCES

#: The extra file of the ``.pt2`` that holds the quantization plan.
PLAN_FILE = "paretorch.mlx_plan.json"
EXAMPLE_BATCH = 2
CHECK_BATCH = 3


class MLXExportConfig(ExportConfig):
    """The float graph for MLX, with the recipe's quantization mapped to MLX's affine quantization.

    * ``quantize``: ``mirror`` the recipe's quantize stage with ``mx.quantize``, or ``none`` (float32).
    * ``group_size``: MLX's group for a method torch quantizes per channel (int8 weight-only).
    """

    stage = "export.mlx"

    quantize: Literal["mirror", "none"] = "mirror"
    group_size: Literal[32, 64, 128] = 64  # mlx.nn.quantize's default


def _dynamic_shapes(inputs: Batch) -> tuple[dict[int, object], ...]:
    """Batch (and a token input's length) left to ``torch.export`` to keep symbolic where the model allows."""
    return tuple({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO} if is_token_input(t)
                 else {0: torch.export.Dim.AUTO} for t in inputs)


def apply(model: nn.Module, config: MLXExportConfig, ctx: StageContext) -> ExportResult:
    """Write ``<spec>.mlx.pt2`` and check that MLX runs it like torch."""
    mirror = export_mirror(ctx.upstream)
    exported_mirror = mirror if config.quantize == "mirror" else mirror.without(WeightQuantization)
    if reasons := REPRODUCES.refusals(exported_mirror):
        raise InfeasibleConfig(f"MLX cannot run this recipe as trained: {'; '.join(reasons)} "
                               "(run it with a torch runtime, or change the recipe)")
    float_model = move_module(ctx.float_model if ctx.float_model is not None else model, torch.device("cpu")).eval()
    inputs = tuple(t.cpu() for t in ctx.example_inputs(EXAMPLE_BATCH))
    try:
        program = torch.export.export(float_model, inputs, dynamic_shapes=_dynamic_shapes(inputs))
    except Exception as exc:  # torch.export raises many types (UserError, Unsupported, ...)
        raise converter_failure("torch.export of the float model", exc) from exc
    try:
        plan = quant_plan(program.run_decompositions({}), exported_mirror, ctx.spec.protected_layers,
                          config.group_size)
        mlx_fn = lower(program, plan.quantize)
    except (UnsupportedOps, ValueError) as exc:
        raise InfeasibleConfig(f"MLX: {exc}") from exc
    checked = _check(float_model, mlx_fn, ctx, plan)
    name = f"{ctx.spec.name}.mlx.pt2"
    output_dir = ctx.require_output_dir()
    extra = {f"{k}.json": v for k, v in artifact_metadata(ctx.upstream, "mlx").items()}
    with atomic_artifact(output_dir, name) as staged:
        torch.export.save(program, staged, extra_files={**extra, PLAN_FILE: plan.to_json()})
    path = output_dir / name
    return ExportResult(format="mlx", path=path, size_bytes=artifact_size_bytes(path),
                        validation=f"torch.export of the float graph lowered to mlx.core ops ({plan.describe()}); "
                                   f"{checked}")


def _check(float_model: nn.Module, mlx_fn: object, ctx: StageContext, plan: QuantPlan) -> str:
    parts = []
    for batch in (ctx.example_inputs(EXAMPLE_BATCH), ctx.example_inputs(CHECK_BATCH)):
        batch = tuple(t.cpu() for t in batch)
        reference = run_reference(float_model, batch)
        outputs = mlx_fn(*(to_mx(t) for t in batch))  # type: ignore[operator]
        mx.eval(outputs)
        comparison = compare_outputs(reference, [to_torch(o, torch.device("cpu")).float() for o in outputs])
        require_close(comparison, bool(plan.quantize), "MLX's output")
        parts.append(f"batch {int(batch[0].shape[0])}: {comparison.describe()}")
    return "outputs vs the torch float graph (" + "; ".join(parts) + ")"


STAGE = Stage(MLXExportConfig, apply, produces="export", order=None)
