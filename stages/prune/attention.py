"""Multi-head attention for structured pruning: which projections hold heads.

Channel pruning that ignores heads leaves a query / key / value projection with a
width that is no multiple of the head size, and the attention's reshape to
``(..., heads, head_size)`` fails. Given each projection's head count, torch-pruning
removes whole heads instead (the same heads from query, key and value, and the
matching input channels of the output projection), so head size is unchanged.

Found by the Hugging Face convention: a module with an integer ``num_attention_heads``
and Linear children ``query`` / ``key`` / ``value`` (BERT, MiniLM, RoBERTa, ...) or
``q_proj`` / ``k_proj`` / ``v_proj`` with equal widths (no grouped key / value heads).
"""

from __future__ import annotations

from typing import Any

from torch import nn

#: Child names of the query, key and value projections, by model family.
PROJECTION_NAMES = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"))


def attention_heads(model: nn.Module) -> dict[nn.Module, int]:
    """{query / key / value Linear: number of heads} for every attention module found."""
    heads: dict[nn.Module, int] = {}
    for attention, projections in _attention_modules(model):
        for projection in projections:
            heads[projection] = attention.num_attention_heads
    return heads


def sync_head_counts(model: nn.Module, pruned_heads: dict[nn.Module, int]) -> dict[str, int]:
    """After pruning, set each attention module's ``num_attention_heads`` (and
    ``all_head_size`` where it has one) to what remains; returns {module: heads}."""
    remaining: dict[str, int] = {}
    names = {module: name for name, module in model.named_modules()}
    for attention, projections in _attention_modules(model):
        heads = pruned_heads.get(projections[0], attention.num_attention_heads)
        attention.num_attention_heads = heads
        if isinstance(getattr(attention, "all_head_size", None), int):
            attention.all_head_size = projections[0].out_features
        remaining[names[attention]] = heads
    return remaining


def _attention_modules(model: nn.Module) -> list[tuple[Any, tuple[nn.Linear, ...]]]:
    found = []
    for module in model.modules():
        if not isinstance(getattr(module, "num_attention_heads", None), int):
            continue
        for names in PROJECTION_NAMES:
            projections = tuple(getattr(module, name, None) for name in names)
            linears = tuple(p for p in projections if isinstance(p, nn.Linear))
            if len(linears) == len(names) and len({p.out_features for p in linears}) == 1:
                found.append((module, linears))
                break
    return found
