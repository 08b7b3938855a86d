"""Which model inputs are token sequences (ids, masks): the one test exports and runtimes share."""

from __future__ import annotations

import torch


def is_token_input(tensor: torch.Tensor) -> bool:
    """An integer input of two or more dims (token ids, a mask): its dim 1 is a sequence whose length
    varies from batch to batch, so exported graphs keep that dim dynamic."""
    return tensor.dim() >= 2 and not tensor.is_floating_point() and not tensor.is_complex()
