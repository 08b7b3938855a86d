"""Unstructured (weight) pruning with ``torch.nn.utils.prune``.

Zeroes the smallest-magnitude weights of every Linear/Conv layer except the
head and protected ones, then makes the zeros permanent (``prune.remove``).
Dense kernels run no faster; the zeros pay off when the export stage stores
the weights sparse (Core ML).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from torch import Tensor, nn
from torch.nn.utils import prune

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import Batch
from paretorch.stages.prune.model_checks import WEIGHT_LAYERS, check_pruned_forward
from paretorch.stages.prune.training import split_steps

if TYPE_CHECKING:
    from paretorch.stages.prune.stage import PruneConfig


def prunable_weight_layers(model: nn.Module, excluded: list[nn.Module]) -> list[tuple[str, nn.Module]]:
    """Named Linear/Conv layers of ``model`` that are neither ``excluded`` nor inside one."""
    guarded = {id(sub) for module in excluded for sub in module.modules()}
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, WEIGHT_LAYERS) and id(module) not in guarded
    ]


def prune_unstructured(
    model: nn.Module,
    config: PruneConfig,
    inputs: Batch,
    expected_shapes: list[tuple[int, ...]],
    excluded: list[nn.Module],
    finetune: Callable[[int], None],
) -> float:
    """Zero ``config.ratio`` of the weights of the prunable layers (in place); returns the achieved sparsity.

    ``scope="uniform"``: ``l1_unstructured`` per layer (each layer loses the same
    fraction); ``"global"``: ``global_unstructured`` over all of them at once.
    Iterative pruning raises the target linearly over the steps; fine-tuning
    after each step runs with the masks in place, so pruned weights stay zero.
    """
    layers = prunable_weight_layers(model, excluded)
    if not layers:
        raise InfeasibleConfig(
            "unstructured pruning: no Linear/Conv layer to prune besides the head and protected layers"
        )
    parameters = [(module, "weight") for _, module in layers]
    for step, finetune_steps in enumerate(split_steps(config.finetune_steps, config.iterative_steps), start=1):
        amount = config.ratio * step / config.iterative_steps
        # Earlier zeros have the smallest magnitude, so they stay inside the new, larger mask.
        if config.scope == "global":
            prune.global_unstructured(parameters, pruning_method=prune.L1Unstructured, amount=amount)
        else:
            for module, name in parameters:
                prune.l1_unstructured(module, name, amount=amount)
        finetune(finetune_steps)
        for module, name in parameters:
            prune.remove(module, name)
        what = f"unstructured pruning step {step}/{config.iterative_steps} (ratio {config.ratio})"
        check_pruned_forward(model, inputs, expected_shapes, what)
    weights = [cast(Tensor, module.weight) for module, _ in parameters]
    return sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
