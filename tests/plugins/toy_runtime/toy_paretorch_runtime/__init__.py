"""A third-party runtime: the whole of it is this module plus one entry-point line.

``inference_mode`` calls the torch model under ``torch.inference_mode()`` (no autograd bookkeeping at all). It runs
the built model itself, so it reproduces any recipe (the default declaration) and declares no export.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from paretorch.extend import ExportHandle, Runtime


class InferenceMode(Runtime):
    """The module called under ``torch.inference_mode()``."""

    name = "inference_mode"

    def available(self, device: torch.device) -> bool:
        return True

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        def run(*inputs: Tensor) -> Tensor:
            with torch.inference_mode():
                return model(*inputs)

        return run


RUNTIME = InferenceMode()
