"""The prune stage: structured channel pruning (torch-pruning), unstructured
weight pruning (``torch.nn.utils.prune``) or depth pruning (whole residual blocks),
with optional recovery fine-tuning.

``ratio`` means the fraction of channels removed from every prunable group
(structured; attention heads and FFN widths may have their own ratios), the
fraction of weights zeroed in the pruned layers (unstructured) or the fraction
of removable blocks removed (depth). The output head (found automatically) keeps its outputs and the
protected layers (spec + config) keep all their weights. Every pruned model is
run on the spec's example inputs; if it fails or its output shapes change, the
config is infeasible. The machinery lives in :mod:`paretorch.stages.prune`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Self

from pydantic import Field, model_validator
from torch import nn

from paretorch.pipeline.core.device import move_module
from paretorch.pipeline.core.evaluate import count_params
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.model_facts import ModelFacts
from paretorch.pipeline.core.short_notation import short_value
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext
from paretorch.stages.common.mirror_facts import Sparsity
from paretorch.stages.prune.depth import prune_depth
from paretorch.stages.prune.facts import PruneFacts, read_facts
from paretorch.stages.prune.model_checks import find_output_head, protected_modules, reference_shapes
from paretorch.stages.prune.structured import prune_structured
from paretorch.stages.prune.training import recovery_finetune, require_training
from paretorch.stages.prune.unstructured import prune_unstructured

if TYPE_CHECKING:
    import optuna


class PruneConfig(StageConfig):
    """How to prune: method, how much, how channels are ranked, and recovery fine-tuning.

    * ``method``: ``structured`` removes whole channels (smaller, faster model);
      ``unstructured`` zeroes single weights (same shapes; pays off only through
      sparse export, e.g. Core ML); ``depth`` removes whole residual blocks (encoder
      layers, ResNet / MobileNet blocks), those whose skipping changes the output on
      the calibration batches least (:mod:`paretorch.stages.prune.depth`).
    * ``ratio``: fraction of channels (structured), weights (unstructured) or removable
      blocks (depth; at least one) removed.
    * ``head_ratio``: structured only: fraction of attention heads removed (None: ``ratio``;
      0: keep every head).
    * ``ffn_ratio``: structured only: fraction of the intermediate width of every FFN block
      (``Linear -> activation -> Linear``, e.g. BERT's ``intermediate.dense``) removed
      (None: ``ratio``; 0: keep the FFN widths). :mod:`paretorch.stages.prune.ffn` finds the blocks.
    * ``importance``: channel ranking for structured pruning: group L1/L2 weight
      norm, BatchNorm scale (needs BatchNorm), or first-order Taylor |w * dL/dw|
      (gradients of the spec's loss on training batches, else of a pseudo-label
      loss on calibration batches; see :func:`paretorch.stages.prune.training.taylor_gradients`).
      Unstructured pruning ranks single weights by magnitude (``l1`` and ``l2`` agree).
    * ``scope``: ``uniform`` prunes every layer/group by ``ratio``; ``global`` ranks
      all of them together (layers lose different fractions, ``ratio`` on average).
    * ``iterative_steps``: reach ``ratio`` in that many equal steps, re-ranking
      (and fine-tuning, if any) in between.
    * ``finetune_steps`` / ``finetune_lr``: Adam steps over the spec's training data
      after pruning (split evenly between iterative steps); needs ``spec.training``.
    * ``protected_layers``: module names never pruned, besides ``spec.protected_layers``.
    """

    stage = "prune"

    method: Literal["structured", "unstructured", "depth"] = "structured"
    ratio: float = Field(gt=0.0, le=0.9)
    head_ratio: float | None = Field(default=None, ge=0.0, le=0.9)
    ffn_ratio: float | None = Field(default=None, ge=0.0, le=0.9)
    importance: Literal["l1", "l2", "bn_scale", "taylor"] = "l2"
    scope: Literal["uniform", "global"] = "uniform"
    iterative_steps: int = Field(default=1, ge=1, le=10)
    finetune_steps: int = Field(default=0, ge=0, le=2000)
    finetune_lr: float = Field(default=1e-3, gt=0.0)
    protected_layers: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _options_fit_method(self) -> Self:
        if self.method == "unstructured" and self.importance not in ("l1", "l2"):
            raise ValueError(
                f"importance={self.importance!r} needs method='structured': "
                "unstructured pruning ranks single weights by magnitude (use 'l1' or 'l2')"
            )
        if self.method == "depth" and (self.importance != "l2" or self.scope != "uniform"):
            raise ValueError(
                f"importance={self.importance!r} / scope={self.scope!r} do not apply to method='depth': "
                "depth pruning ranks blocks by their measured effect on the output (leave the defaults)"
            )
        for name in ("head_ratio", "ffn_ratio"):
            if getattr(self, name) is not None and self.method != "structured":
                raise ValueError(f"{name} needs method='structured' (method is {self.method!r})")
        return self

    def to_dict(self) -> dict[str, object]:
        """As the base, without ``head_ratio`` / ``ffn_ratio`` when unset: a config that
        does not use them keeps the dict (and the runner's cache key) it had before they existed."""
        data = super().to_dict()
        for name in ("head_ratio", "ffn_ratio"):
            if data.get(name) is None:
                data.pop(name, None)
        return data

    def structure_only(self) -> Self:
        """Without the recovery fine-tuning: the same channels, heads or blocks removed, for saved weights."""
        return self.model_copy(update={"finetune_steps": 0}) if self.finetune_steps else self

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """Search space: off, or a method, a ratio in 0.1..0.7, and for structured
        pruning an importance, a scope and what to prune (``prune.structure``: all
        channel groups, attention heads only (``ffn_ratio=0``) or FFN widths only
        (``head_ratio=0``)); recovery fine-tuning (0 or 100 steps) only when the spec
        has training data. ``bn_scale`` is left to recipes: it is infeasible on models
        without BatchNorm. The spec does not say whether the model has heads, FFN blocks
        or removable blocks: a choice that finds none is an infeasible trial, except what the model's
        facts rule out (:func:`rules_out`), which is not offered: depth pruning on a model without a
        removable block; any pruning of a TorchScript model (then the stage stays off)."""
        methods = ctx.offered("prune.method", ["structured", "unstructured", "depth"],
                              lambda choice: _ruled_out(cls.model_validate({"method": choice, "ratio": 0.1}), ctx))
        if not methods or not trial.suggest_categorical("prune.enabled", [False, True]):
            return None
        method = trial.suggest_categorical("prune.method", methods)
        ratio = trial.suggest_float("prune.ratio", 0.1, 0.7, step=0.1)
        fields: dict[str, object] = {"method": method, "ratio": round(ratio, 2)}
        if method == "structured":
            fields["importance"] = trial.suggest_categorical("prune.importance", ["l1", "l2", "taylor"])
            structure = trial.suggest_categorical("prune.structure", ["all", "heads", "ffn"])
            fields |= {"all": {}, "heads": {"ffn_ratio": 0.0}, "ffn": {"head_ratio": 0.0}}[structure]
        if method != "depth":
            fields["scope"] = trial.suggest_categorical("prune.scope", ["uniform", "global"])
        if ctx.spec.training is not None and ctx.spec.loss is not None:
            fields["finetune_steps"] = trial.suggest_categorical("prune.finetune_steps", [0, 100])
        return cls.model_validate(fields)


def apply_prune(model: nn.Module, config: PruneConfig, ctx: StageContext) -> nn.Module:
    """Prune ``model`` (the registry hands a copy) on ``ctx.device`` and return it in eval mode.

    Records ``prune.params_before`` / ``prune.params_after`` (and, for
    unstructured pruning, ``prune.sparsity`` over the pruned layers; for Taylor
    importance, ``prune.taylor_loss``: which loss gave the gradients; when attention
    heads were pruned, ``prune.attention_heads``: {attention module: heads left}; when FFN
    blocks were pruned, ``prune.ffn_widths``: {first Linear: width left}; for depth pruning,
    the block costs and removed blocks, see :func:`paretorch.stages.prune.depth.prune_depth`).
    """
    if config.finetune_steps > 0:
        require_training(ctx.spec, "recovery fine-tuning (finetune_steps > 0)")
    model = move_module(model, ctx.device).eval()
    inputs = ctx.example_inputs()
    expected_shapes = reference_shapes(model, inputs)
    head_name = find_output_head(model, inputs)
    modules = dict(model.named_modules())
    head = modules[head_name] if head_name is not None else None
    protected = list(protected_modules(model, (*ctx.spec.protected_layers, *config.protected_layers)).values())
    ctx.record("prune.head", head_name or "")
    ctx.record("prune.params_before", count_params(model))

    def finetune(steps: int) -> None:
        recovery_finetune(model, ctx.spec, ctx.device, steps, config.finetune_lr)

    if config.method == "structured":
        prune_structured(model, config, ctx, inputs, expected_shapes, head, protected, finetune)
    elif config.method == "depth":  # a removed block keeps the output shape: only protected layers stay
        prune_depth(model, config, ctx, inputs, expected_shapes, protected, finetune)
    else:
        excluded = [m for m in (head, *protected) if m is not None]
        ctx.record("prune.sparsity", prune_unstructured(model, config, inputs, expected_shapes, excluded, finetune))
    ctx.record("prune.params_after", count_params(model))
    return model.eval()


def rules_out(config: PruneConfig, facts: ModelFacts) -> str | None:
    """Why ``config`` cannot change the model ``facts`` describe: a TorchScript model (torch-pruning
    traces and rewrites Python modules), or depth pruning without a removable block."""
    if (scripted := facts.scripted_reason("pruning cannot rewrite")) is not None:
        return scripted
    known = facts.of(PruneConfig.stage)
    if config.method == "depth" and isinstance(known, PruneFacts) and not known.removable_blocks:
        return ("depth pruning finds no removable block in this model (an element of an "
                "nn.ModuleList / nn.Sequential with two or more Linear/Conv layers and a sibling of its class, "
                "called once, whose output has its input's shape, holding no protected layer)")
    return None


def _ruled_out(config: PruneConfig, ctx: StageContext) -> str | None:
    return rules_out(config, ctx.facts) if ctx.facts is not None else None


def mirror(config: PruneConfig) -> ExportMirror:
    """Structured pruning is in the float graph the exports convert; unstructured pruning's
    zeros are too, and exports may store them sparse."""
    if config.method != "unstructured":
        return ExportMirror()
    return ExportMirror((Sparsity(ratio=config.ratio),))


def short(config: PruneConfig) -> str:
    """``prune 0.3``; ``prune depth 0.25`` / ``prune sparse 0.5``; ``prune heads 0.25`` (FFN widths kept),
    ``prune ffn 0.25`` (heads kept); other head / FFN ratios follow as ``heads 0.1 ffn 0.4``."""
    ratio, heads, ffn = config.ratio, config.head_ratio, config.ffn_ratio
    if config.method == "depth":
        return f"prune depth {short_value(ratio)}"
    if config.method == "unstructured":
        return f"prune sparse {short_value(ratio)}"
    if ffn == 0 and heads != 0:
        return f"prune heads {short_value(ratio if heads is None else heads)}"
    if heads == 0 and ffn != 0:
        return f"prune ffn {short_value(ratio if ffn is None else ffn)}"
    text = f"prune {short_value(ratio)}"
    for name, value in (("heads", heads), ("ffn", ffn)):
        if value is not None and value != ratio:
            text += f" {name} {short_value(value)}"
    return text


STAGE = Stage(PruneConfig, apply_prune, mirror=mirror, order=10, facts=read_facts, rules_out=rules_out, short=short,
              libraries=("torch-pruning",))
