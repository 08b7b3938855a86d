"""How a quantize config names itself: in the short recipe notation (``int8s``) and to the machine probe (``int8``).

The quantize stage's record declares both (``Stage(..., short=short, precision=precision)``), so the notation and
the probe read the method from the stage, not from a table of stage names in core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paretorch.pipeline.core.short_notation import kept_layers
from paretorch.stages.quantize.methods import method

if TYPE_CHECKING:
    from paretorch.stages.quantize.stage import QuantizeConfig


def short(config: QuantizeConfig) -> str:
    """``int8s`` for ``int8_static_pt2e``: the method's first word and the initial of its second (``float``
    as ``fp``: ``fp8d``), a non-default group size (``int4w g32``), ``asym``, and the layers kept float."""
    words = config.method.replace("float", "fp").split("_")
    text = words[0] + (words[1][:1] if len(words) > 1 else "")
    if config.group_size != type(config).model_fields["group_size"].default:  # the default is left unsaid
        text += f" g{config.group_size}"
    if config.mapping == "asymmetric":
        text += " asym"
    return text + kept_layers(len(config.float_layers or ()), "float")


def precision(config: QuantizeConfig) -> str:
    """The weights' precision: ``int8`` (the one the machine probe times), ``int4``, or ``float8``."""
    bits = method(config.method).weight_bits
    return f"int{bits}" if bits is not None else "float8"
