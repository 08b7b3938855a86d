"""The pack stage: run a padded BERT-family sequence model on its real tokens only.

A padded batch spends most of its matrix work on padding (MiniLM's latency batch at 256 rows:
68 % on an H100). :class:`~paretorch.stages.pack.packed.PackedBert` takes the same inputs and returns the
same outputs, but packs the batch's real tokens into one sequence for the embeddings, linear
layers, norms and activations, and runs attention per sequence (:mod:`paretorch.stages.pack.attention`).
It reuses the model's own modules, so the stages after it (quantize, amp) see the same layers.

Exports keep the padded graph: the stage is ``numeric`` in the registry's sense (exports convert
the model before it, ``ctx.float_model``) and its mirror is :class:`~paretorch.stages.common.mirror_facts.PaddingFree`:
a runtime that runs a file reproduces it by calling the padded file once per group of similar-length rows
(``onnxruntime`` and ``openvino`` declare so: :mod:`paretorch.pipeline.core.length_groups`), and the export records the
padding-mask input those calls group by; a runtime that declares nothing of the kind (MLX) rules a packed recipe
out before it runs.
The packing layout is built inside the graph from the sequence starts, which come from the host where
the lengths are known (:mod:`paretorch.stages.pack.layout`); under ``torch.compile`` the packed length is bucketed
(static shapes). A deployment runs the packed model from token id lists: :mod:`paretorch.stages.pack.deploy` (the
record's ``deploy``; ``pipeline apply`` writes its files, :func:`paretorch.pipeline.api.load_deployment` rebuilds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Self

import torch
from torch import nn

from paretorch.pipeline.core.device import move_module
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.length_groups import PACK
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.model_facts import ModelFacts
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext
from paretorch.stages.common.mirror_facts import PaddingFree
from paretorch.stages.pack.bert import MASK_INPUT, find_packable
from paretorch.stages.pack.deploy import PackedEncoder
from paretorch.stages.pack.packed import PackedBert

if TYPE_CHECKING:
    import optuna

#: Rows of the spec's example inputs the packed model is checked on against the padded one.
CHECK_ROWS = 8
#: Largest relative difference (max abs difference / max abs output) the check accepts:
#: float32 packing changes only summation order; reduced dtypes upstream move more.
CHECK_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


class PackConfig(StageConfig):
    """Padding-free execution. ``attention``: the per-sequence attention kernel: ``auto`` (FlexAttention inside a
    compiled graph on CUDA, varlen Flash Attention in eager on CUDA in float16 / bfloat16, else ``padded``),
    ``varlen``, ``flex`` (FlexAttention with a document mask over the packed sequence), ``nested`` (nested jagged
    tensors + SDPA) or ``padded`` (the padded layout for attention only)."""

    stage = PACK

    attention: Literal["auto", "varlen", "flex", "nested", "padded"] = "auto"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """On or off (``pack.enabled``), offered only where the model's facts do not rule packing out."""
        choices = ctx.offered("pack.enabled", [False, True], lambda on: _ruled_out(cls(), ctx) if on else None)
        if True not in choices:
            return None
        return cls() if trial.suggest_categorical("pack.enabled", choices) else None


@dataclass(frozen=True)
class PackFacts:
    """Whether the unoptimized model can be packed: None, or why not."""

    problem: str | None


def packing_problem(model: nn.Module, mask_index: int | None) -> str | None:
    """Why the stage cannot pack ``model`` whose spec's padding mask is input ``mask_index`` (None: it can)."""
    if mask_index is None:
        return "the spec declares no padding mask (ModelSpec.padding_mask): there is no padding to skip"
    if mask_index != MASK_INPUT:
        return f"the padding mask is input {mask_index}; packing knows forward(input_ids, attention_mask)"
    found = find_packable(model)
    return found if isinstance(found, str) else None


def read_facts(model: nn.Module, ctx: StageContext) -> PackFacts:
    """Whether the unoptimized model can be packed (structure only; no forward pass)."""
    return PackFacts(packing_problem(model, ctx.spec.padding_mask))


def rules_out(config: PackConfig, facts: ModelFacts) -> str | None:
    """Why packing cannot change the model ``facts`` describe (TorchScript, no padding mask, not BERT)."""
    if (scripted := facts.scripted_reason("packing cannot rewrite")) is not None:
        return scripted
    known = facts.of(PackConfig.stage)
    if isinstance(known, PackFacts) and known.problem is not None:
        return known.problem  # the search says "pack: <problem>"
    return None


def _ruled_out(config: PackConfig, ctx: StageContext) -> str | None:
    return rules_out(config, ctx.facts) if ctx.facts is not None else None


def apply_pack(model: nn.Module, config: PackConfig, ctx: StageContext) -> nn.Module:
    """``model`` (the registry's copy) run padding-free, checked against the padded model on the spec's
    example inputs. A model the stage cannot pack is handed back unchanged, with the reason recorded
    (``pack.not_packed``; a search never offers that: :func:`rules_out`). Records ``pack.attention``
    (the kernel on this device and dtype) and ``pack.check_max_abs_diff``."""
    problem = packing_problem(model, ctx.spec.padding_mask)
    if problem is not None:
        ctx.record("pack.not_packed", problem)
        return model
    paths = find_packable(model)
    if isinstance(paths, str):  # checked by packing_problem
        raise InfeasibleConfig(f"pack: {paths}")
    model = move_module(model, ctx.device).eval()
    packed = PackedBert(model, paths, config.attention).eval()
    inputs = ctx.example_inputs(CHECK_ROWS)
    try:
        with torch.inference_mode():
            expected, actual = model(*inputs), packed(*inputs)
    except (RuntimeError, ValueError) as exc:
        raise InfeasibleConfig(f"pack: the packed model fails on the example inputs: {type(exc).__name__}: {exc}") \
            from exc
    difference = float((actual.float() - expected.float()).abs().max())
    scale = max(float(expected.float().abs().max()), 1e-12)
    tolerance = CHECK_TOLERANCE.get(expected.dtype, 5e-2)
    if expected.shape != actual.shape or not difference <= tolerance * scale:
        raise InfeasibleConfig(f"pack: the packed model's outputs differ from the padded model's "
                               f"(max abs diff {difference:.3g}, allowed {tolerance * scale:.3g})")
    ctx.record("pack.check_max_abs_diff", difference)
    ctx.record("pack.attention", config.attention)
    return packed


def mirror(config: PackConfig) -> ExportMirror:
    """Exports convert the padded model; a file runtime calls it per length group (:class:`PaddingFree`)."""
    return ExportMirror((PaddingFree(),))


def short(config: PackConfig) -> str:
    """``pack`` (its attention kernel is in the full recipe)."""
    return config.stage


STAGE = Stage(PackConfig, apply_pack, numeric=True, mirror=mirror, order=25, facts=read_facts, traceable=False,
              rules_out=rules_out, deploy=PackedEncoder, short=short)
