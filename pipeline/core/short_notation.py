"""The pieces of the short recipe notation (``prune 0.3 + distill 200 + int8s | ort``) that every stage writes alike.

A stage writes its own configs (:attr:`paretorch.pipeline.core.stage.Stage.short`); the notation itself, and the
form of a stage that declares none, is :mod:`paretorch.pipeline.engine.short_recipe`'s. A number shows with two
significant digits, a list as its length, layers left out of a numeric stage as their count.
"""

from __future__ import annotations


def short_value(value: object) -> str:
    """``0.34`` for 0.3417, ``[3]`` for a list of 3, anything else as its ``str``."""
    if isinstance(value, float):
        return f"{value:.2g}"
    if isinstance(value, list | tuple):
        return f"[{len(value)}]"
    return str(value)


def kept_layers(count: int, dtype: str = "fp32") -> str:
    """`` (3 fp32)``: layers left out of a numeric stage in ``dtype``; empty when none are."""
    return f" ({count} {dtype})" if count else ""
