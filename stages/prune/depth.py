"""Depth pruning: remove whole residual blocks (encoder layers, ResNet / MobileNet blocks)
chosen by their measured effect on the model output.

Candidates are the elements of an ``nn.ModuleList`` / ``nn.Sequential`` that

* hold at least two Linear/Conv layers (a block, not a single layer or activation),
* are repeated: their container holds another element of the same class (stages of
  blocks, encoder layers; not a lone squeeze-excitation inside a block),
* are called exactly once per forward pass,
* take a tensor and return a tensor of the same shape (residual: the next block can read
  the input instead); a block returning a tuple or changing the shape never is one,
* hold no protected layer (the output head may sit in a block: removing it keeps the output shape),
* and are not inside another candidate (the outermost block wins).

A block's cost is the relative squared change of the model output on the spec's
calibration batches when that block alone is skipped (its input passed through):
``sum ||y_skip - y||^2 / sum ||y||^2``. The blocks with the lowest cost are removed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import Batch
from paretorch.stages.common.layer_outputs import tensor_leaves
from paretorch.stages.prune.model_checks import WEIGHT_LAYERS, check_pruned_forward
from paretorch.stages.prune.training import split_steps

if TYPE_CHECKING:
    from paretorch.pipeline.core.stage import StageContext
    from paretorch.stages.prune.stage import PruneConfig

#: How many calibration batches the importance of each block is measured on.
DEPTH_BATCHES = 4


@dataclass(frozen=True)
class Block:
    """One candidate block: where it sits (``container[key]``) and its full module name."""

    name: str
    container: nn.Module
    key: str
    module: nn.Module


class RemovedBlock(TypedDict):
    """One entry of ``prune.removed_blocks``: the block, its measured cost, the step that removed it."""

    block: str
    cost: float
    step: int


class SkippedBlock(nn.Module):
    """Stands in for a removed block: returns the tensor the block was given."""

    def forward(self, *args: object, **kwargs: object) -> Tensor:
        return first_tensor(args, kwargs)


def first_tensor(args: Sequence[object], kwargs: dict[str, object]) -> Tensor:
    """The first tensor among a call's positional, then keyword arguments."""
    leaves = tensor_leaves((tuple(args), kwargs))
    if not leaves:
        raise TypeError("a skipped block was called without a tensor argument")
    return leaves[0]


def candidate_blocks(model: nn.Module, inputs: Batch, excluded: list[nn.Module]) -> list[Block]:
    """The blocks of ``model`` that depth pruning may remove (see the module docstring), in model order."""
    guarded = {id(sub) for module in excluded for sub in module.modules()}
    blocks = [
        Block(f"{name}.{key}" if name else key, container, key, child)
        for name, container in model.named_modules()
        if isinstance(container, (nn.ModuleList, nn.Sequential))
        for key, child in container.named_children()
        if _weight_layer_count(child) >= 2
        and sum(type(other) is type(child) for other in container.children()) >= 2
        and not any(id(sub) in guarded for sub in child.modules())
    ]
    calls = _probe_calls(model, inputs, blocks)
    residual = [block for block in blocks if calls.get(id(block.module)) == ["same"]]
    inside = {id(sub) for block in residual for sub in block.module.modules() if sub is not block.module}
    return [block for block in residual if id(block.module) not in inside]


def block_costs(
    model: nn.Module, blocks: list[Block], batches: Sequence[Batch]
) -> tuple[dict[str, float], dict[str, str]]:
    """({block name: relative output change on ``batches`` when that block alone is skipped},
    {block name: why the model cannot run without it}) for ``blocks``.

    A block whose skipping breaks the forward pass or gives non-finite outputs lands in the
    second dict (it is never removed)."""
    costs: dict[str, float] = {}
    failures: dict[str, str] = {}
    with torch.no_grad():
        references = [tensor_leaves(model(*batch)) for batch in batches]
        for block in blocks:
            block.container._modules[block.key] = SkippedBlock()
            try:
                cost = _relative_change(model, batches, references)
            except Exception as exc:  # any failure without this block makes it unremovable, with the reason
                failures[block.name] = f"the forward pass fails without it: {type(exc).__name__}: {exc}"
            else:
                if math.isfinite(cost):
                    costs[block.name] = cost
                else:
                    failures[block.name] = "the output is not finite without it"
            finally:
                block.container._modules[block.key] = block.module
    return costs, failures


def prune_depth(
    model: nn.Module,
    config: PruneConfig,
    ctx: StageContext,
    inputs: Batch,
    expected_shapes: list[tuple[int, ...]],
    protected: list[nn.Module],
    finetune: Callable[[int], None],
) -> None:
    """Remove ``config.ratio`` of the candidate blocks of ``model`` (in place; at least one),
    the least important first, in ``config.iterative_steps`` steps (re-measured in each)
    with ``finetune(n)`` after each.

    Records ``prune.block_costs`` ({block: cost} of the first measurement) and
    ``prune.removed_blocks`` ([{block, cost, step}] in removal order), block names as in the
    input model; ``prune.unremovable_blocks`` ({block: reason}) for candidates the model cannot
    run without; ``prune.num_hidden_layers`` when a Hugging Face config was updated.
    Infeasible when the model has no candidate, the spec no calibration batches, too few
    blocks can be skipped, or the pruned model no longer runs.
    """
    blocks = candidate_blocks(model, inputs, protected)
    batches = _measurement_batches(blocks, ctx)
    total = min(len(blocks), max(1, round(config.ratio * len(blocks))))
    lengths = {id(block.container): len(block.container._modules) for block in blocks}
    removed: list[RemovedBlock] = []
    counts = split_steps(total, config.iterative_steps)
    finetunes = split_steps(config.finetune_steps, config.iterative_steps)
    for step, (count, finetune_steps) in enumerate(zip(counts, finetunes, strict=True), start=1):
        if count == 0:
            continue
        removed += _remove_cheapest(model, [b for b in blocks if b.name not in {r["block"] for r in removed}],
                                    batches, count, step, ctx)
        check_pruned_forward(
            model,
            inputs,
            expected_shapes,
            f"depth pruning step {step} (removed {len(removed)} of {len(blocks)} blocks)",
        )
        finetune(finetune_steps)
    _drop_skipped(model)
    check_pruned_forward(
        model, inputs, expected_shapes, f"depth pruning (removed {len(removed)} of {len(blocks)} blocks)"
    )
    ctx.record("prune.removed_blocks", removed)
    layers = _sync_num_hidden_layers(model, lengths)
    if layers is not None:
        ctx.record("prune.num_hidden_layers", layers)


def _measurement_batches(blocks: list[Block], ctx: StageContext) -> list[Batch]:
    """The calibration batches block costs are measured on; infeasible without a block or a batch."""
    if not blocks:
        raise InfeasibleConfig(
            "depth pruning: the model has no removable block (an element of an nn.ModuleList / "
            "nn.Sequential with two or more Linear/Conv layers and a sibling of its class, called once, "
            "whose output tensor has its input's shape, holding no protected layer)"
        )
    batches = list(ctx.calibration_batches)[:DEPTH_BATCHES]
    if not batches:
        raise InfeasibleConfig(
            f"depth pruning measures block importance on calibration batches; spec '{ctx.spec.name}' has none"
        )
    return batches


def _remove_cheapest(model: nn.Module, remaining: list[Block], batches: list[Batch], count: int, step: int,
                     ctx: StageContext) -> list[RemovedBlock]:
    """Skip the ``count`` blocks of ``remaining`` whose skipping changes the output least (measured now);
    returns what was removed ([{block, cost, step}]) and records the costs and the unremovable blocks."""
    costs, failures = block_costs(model, remaining, batches)
    if "prune.block_costs" not in ctx.records:
        ctx.record("prune.block_costs", costs)
    if failures:
        ctx.record("prune.unremovable_blocks", {**ctx.records.get("prune.unremovable_blocks", {}), **failures})
    removable = [block for block in remaining if block.name in costs]
    if len(removable) < count:
        reasons = "; ".join(f"{name}: {why}" for name, why in failures.items())
        raise InfeasibleConfig(
            f"depth pruning step {step}: {count} blocks to remove but only {len(removable)} can be "
            f"skipped ({reasons})"
        )
    chosen = sorted(removable, key=lambda block: costs[block.name])[:count]
    for block in chosen:
        block.container._modules[block.key] = SkippedBlock()
    return [{"block": block.name, "cost": costs[block.name], "step": step} for block in chosen]


def _weight_layer_count(module: nn.Module) -> int:
    return sum(isinstance(sub, WEIGHT_LAYERS) for sub in module.modules())


def _probe_calls(model: nn.Module, inputs: Batch, blocks: list[Block]) -> dict[int, list[str]]:
    """{id(block module): ['same' | 'changed'] per call} from one forward pass on ``inputs``."""
    calls: dict[int, list[str]] = {}

    def hook(module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: object) -> None:
        given = tensor_leaves((args, kwargs))
        same = isinstance(output, Tensor) and bool(given) and given[0].shape == output.shape
        calls.setdefault(id(module), []).append("same" if same else "changed")

    handles = [block.module.register_forward_hook(hook, with_kwargs=True) for block in blocks]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def _relative_change(model: nn.Module, batches: Sequence[Batch], references: list[list[Tensor]]) -> float:
    change, energy = 0.0, 0.0
    for batch, reference in zip(batches, references, strict=True):
        outputs = tensor_leaves(model(*batch))
        for output, expected in zip(outputs, reference, strict=True):
            if not expected.is_floating_point():
                continue
            change += float((output.float() - expected.float()).pow(2).sum())
            energy += float(expected.float().pow(2).sum())
    if not math.isfinite(change):
        return math.inf
    return change / max(energy, 1e-12)


def _drop_skipped(model: nn.Module) -> None:
    """Delete the skipped blocks from containers whose keys are positions (ModuleList,
    plain Sequential), so that the container is shorter; named ones keep the stand-in."""
    for container in list(model.modules()):
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        if not all(key.isdigit() for key in container._modules):
            continue
        kept = [child for child in container._modules.values() if not isinstance(child, SkippedBlock)]
        if len(kept) < len(container._modules):
            container._modules = {str(i): child for i, child in enumerate(kept)}


def _sync_num_hidden_layers(model: nn.Module, lengths: dict[int, int]) -> int | None:
    """Set ``config.num_hidden_layers`` of Hugging Face configs whose value was the length of
    a container that lost blocks; returns the new value (None: no such config)."""
    now = {id(m): len(m._modules) for m in model.modules() if id(m) in lengths}
    changed = {lengths[key]: length for key, length in now.items() if length != lengths[key]}
    configs = {id(config): config for m in model.modules() if (config := getattr(m, "config", None)) is not None}
    updated = None
    for config in configs.values():
        layers = getattr(config, "num_hidden_layers", None)
        if isinstance(layers, int) and layers in changed:
            config.num_hidden_layers = changed[layers]
            updated = changed[layers]
    return updated
