"""Structured (channel) pruning with torch-pruning's dependency graph.

The dependency graph groups every layer whose channels must shrink together
(a residual sum ties the widths of both branches and of every layer reading
it), so a traced model stays consistent. The output head keeps its output
channels; protected layers keep every weight (no group that touches them is
pruned, neither their outputs nor their inputs). Attention projections lose
whole heads, never channels inside a head (:mod:`paretorch.stages.prune.attention`), at
``head_ratio``; FFN blocks (:mod:`paretorch.stages.prune.ffn`) lose ``ffn_ratio`` of their
intermediate width; every other group loses ``ratio``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import Batch
from paretorch.stages.prune.attention import attention_heads, sync_head_counts
from paretorch.stages.prune.ffn import ffn_input_layers, ffn_widths, sync_intermediate_size
from paretorch.stages.prune.model_checks import check_pruned_forward
from paretorch.stages.prune.training import clear_gradients, split_steps, taylor_gradients

if TYPE_CHECKING:
    from torch_pruning.dependency.group import Group
    from torch_pruning.pruner.algorithms.base_pruner import BasePruner
    from torch_pruning.pruner.importance import Importance

    from paretorch.pipeline.core.stage import StageContext
    from paretorch.stages.prune.stage import PruneConfig


def make_importance(name: str) -> Importance:
    """torch-pruning's importance estimator for the config's ``importance``."""
    import torch_pruning as tp

    if name == "l1":
        return tp.importance.GroupMagnitudeImportance(p=1)
    if name == "l2":
        return tp.importance.GroupMagnitudeImportance(p=2)
    if name == "bn_scale":
        return tp.importance.BNScaleImportance()
    if name == "taylor":
        return tp.importance.GroupTaylorImportance()
    raise ValueError(f"unknown importance '{name}': choose l1, l2, bn_scale or taylor")


@dataclass(frozen=True)
class _Scope:
    """What the pruner keeps whole and the ratios it prunes at: heads and FFN widths may differ from ``ratio``."""

    ignored: list[nn.Module]
    heads: dict[nn.Module, int]
    head_ratio: float
    ffn_layers: list[nn.Linear]
    ffn_ratio: float
    ffn_ratios: dict[nn.Module, float]


def prune_structured(
    model: nn.Module,
    config: PruneConfig,
    ctx: StageContext,
    inputs: Batch,
    expected_shapes: list[tuple[int, ...]],
    head: nn.Module | None,
    protected: list[nn.Module],
    finetune: Callable[[int], None],
) -> None:
    """Remove ``config.ratio`` of the channels of every prunable group of ``model``
    (in place), in ``config.iterative_steps`` steps with ``finetune(n)`` after each.

    ``scope="uniform"`` prunes the same fraction of every group; ``"global"``
    ranks the normalized importances of all groups together, so layers lose
    different fractions. Raises :class:`InfeasibleConfig` if torch-pruning
    fails, nothing can be pruned, or the pruned model no longer runs.
    """
    if config.importance == "bn_scale" and not any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
    ):
        raise InfeasibleConfig("bn_scale importance needs BatchNorm layers (their scale factors), the model has none")
    scope = _scope(model, config, head, protected)
    pruner = _pruner(model, inputs, config, scope)
    unsupported = channel_multiplier_convs(model)
    if unsupported:  # torch-pruning 1.6.1 fails on them (IndexError in step()): keep them and their groups whole
        ctx.record("prune.kept_whole", {name: CHANNEL_MULTIPLIER_REASON for name in unsupported})
    _ignore_groups_touching(pruner, [*protected, *unsupported.values()])
    if not _prunable_groups(pruner):
        kept = f"; kept whole: {', '.join(unsupported)} ({CHANNEL_MULTIPLIER_REASON})" if unsupported else ""
        raise InfeasibleConfig(
            "structured pruning: no channel group can be pruned without touching the head or a protected layer" + kept
        )
    for step, finetune_steps in enumerate(split_steps(config.finetune_steps, config.iterative_steps), start=1):
        what = f"structured pruning step {step}/{config.iterative_steps} (ratio {config.ratio}, {config.importance})"
        _step(model, pruner, config, ctx, scope, what)
        check_pruned_forward(model, inputs, expected_shapes, what)
        finetune(finetune_steps)


def _scope(model: nn.Module, config: PruneConfig, head: nn.Module | None, protected: list[nn.Module]) -> _Scope:
    ignored = [m for m in (head, *protected) if m is not None]
    heads = attention_heads(model)
    head_ratio = config.ratio if config.head_ratio is None else config.head_ratio
    if head_ratio == 0.0:  # keep every head: the projections' output channels stay whole
        ignored.extend(heads)
        heads = {}
    ffn_layers = ffn_input_layers(model)
    ffn_ratio = config.ratio if config.ffn_ratio is None else config.ffn_ratio
    ffn_ratios: dict[nn.Module, float] = {}
    if ffn_ratio == 0.0:  # keep every FFN width
        ignored.extend(ffn_layers)
    elif ffn_ratio != config.ratio:
        ffn_ratios = dict.fromkeys(ffn_layers, ffn_ratio)
    return _Scope(ignored, heads, head_ratio, ffn_layers, ffn_ratio, ffn_ratios)


def _pruner(model: nn.Module, inputs: Batch, config: PruneConfig, scope: _Scope) -> BasePruner:
    """torch-pruning's pruner over ``model``'s dependency graph (InfeasibleConfig: it cannot trace it)."""
    import torch_pruning as tp

    try:
        return tp.pruner.BasePruner(
            model,
            inputs,
            importance=make_importance(config.importance),
            global_pruning=config.scope == "global",
            pruning_ratio=config.ratio,
            pruning_ratio_dict=scope.ffn_ratios,
            iterative_steps=config.iterative_steps,
            ignored_layers=scope.ignored,
            # attention: remove whole heads (same ratio), never channels inside a head
            num_heads=scope.heads,
            prune_num_heads=bool(scope.heads),
            prune_head_dims=False,
            head_pruning_ratio=scope.head_ratio if scope.heads else 0.0,
        )
    except Exception as exc:  # torch-pruning could not trace this graph
        raise InfeasibleConfig(
            f"torch-pruning could not build the dependency graph: {type(exc).__name__}: {exc}"
        ) from exc


def _step(model: nn.Module, pruner: BasePruner, config: PruneConfig, ctx: StageContext, scope: _Scope,
          what: str) -> None:
    """One pruning step, then the heads and FFN widths the model's config records brought in line."""
    if config.importance == "taylor":
        ctx.record("prune.taylor_loss", taylor_gradients(model, ctx.spec, ctx.device, ctx.calibration_batches))
    try:
        pruner.step()
    except Exception as exc:  # torch-pruning failed on this graph
        raise InfeasibleConfig(f"{what}: torch-pruning failed: {type(exc).__name__}: {exc}") from exc
    finally:
        clear_gradients(model)
    if scope.heads:
        ctx.record("prune.attention_heads", sync_head_counts(model, pruner.num_heads))
    if scope.ffn_layers and scope.ffn_ratio > 0.0:
        widths = ffn_widths(model, scope.ffn_layers)
        ctx.record("prune.ffn_widths", widths)
        sync_intermediate_size(model, widths)


#: Why a depthwise convolution with a channel multiplier is never pruned.
CHANNEL_MULTIPLIER_REASON = "depthwise convolution with a channel multiplier: torch-pruning 1.6.1 cannot prune it"


def channel_multiplier_convs(model: nn.Module) -> dict[str, nn.Module]:
    """{name: conv} of the depthwise convolutions with a channel multiplier
    (``groups == in_channels > 1`` and ``out_channels = k * in_channels``, k > 1).

    Plain depthwise convolutions (``groups == in_channels == out_channels``) and other
    grouped convolutions prune correctly with torch-pruning 1.6.1; these do not."""
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.conv._ConvNd)
        and module.groups > 1
        and module.groups == module.in_channels
        and module.out_channels != module.in_channels
    }


def _ignore_groups_touching(pruner: BasePruner, protected: list[nn.Module]) -> None:
    """Make groups that would change a protected layer's *input* channels unprunable too.

    torch-pruning's ``ignored_layers`` only keeps a layer's output channels;
    ignoring the root of every group that reaches a protected module keeps its
    weights whole. (``ignored_layers`` is read at each ``step()``.)
    """
    if not protected:
        return
    guarded = {id(sub) for module in protected for sub in module.modules()}
    roots = []
    for group in _prunable_groups(pruner):
        if any(id(dep.target.module) in guarded for dep, _ in group):
            roots.append(group[0].dep.target.module)
    pruner.ignored_layers.extend(roots)


def _prunable_groups(pruner: BasePruner) -> list[Group]:
    """The dependency groups the pruner may prune (none of their outputs ignored)."""
    return list(
        pruner.DG.get_all_groups(ignored_layers=pruner.ignored_layers, root_module_types=pruner.root_module_types)
    )
