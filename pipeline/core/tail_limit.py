"""The tail guard's numbers as a user sets them (``--tail-limit``, ``--tail-cosine``, the search config's
``tail_limit`` and ``tail_cosine``): the defaults and the parser, without torch, so that the command line checks
them before torch loads. The guard itself is :class:`paretorch.pipeline.core.input_agreement.TailGuard`."""

from __future__ import annotations

#: An embedding input breaks below this cosine to its unoptimized output (the default guard).
COSINE_FLOOR = 0.9
#: The share of inputs allowed to break (the default guard): 1 %.
TAIL_LIMIT = 0.01


def parse_tail_limit(limit: object) -> float | None:
    """``--tail-limit``: a share of the inputs (``1%``, ``0.02``), or ``off`` / None (no guard)."""
    if limit is None or (isinstance(limit, str) and limit.strip().lower() == "off"):
        return None
    text = str(limit).strip()
    try:
        share = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"{limit!r} is not a share of inputs: give one such as 1% or 0.02, or off") from None
    if not 0.0 <= share < 1.0:
        raise ValueError(f"{limit!r}: give a share from 0 to below 100 % (or off)")
    return share
