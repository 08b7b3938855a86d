"""``eager``: the torch module as it is."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.runtimes.base import ExportHandle, Runtime


class Eager(Runtime):
    """The module called directly: runs anywhere, any model form."""

    name = "eager"

    def available(self, device: torch.device) -> bool:
        return True

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        return model


EAGER = Eager()
