"""The ``torchao.quantization.quantize_`` methods: weight-only and dynamic-activation
quantization of ``nn.Linear`` layers (convolutions stay float)."""

from __future__ import annotations

from torch import nn

from paretorch.stages.quantize.methods import method


def quantize_linear_layers(model: nn.Module, name: str, group_size: int, mapping: str, layers: list[str]) -> None:
    """Quantize, in place, the ``nn.Linear`` layers named in ``layers`` with torchao's ``quantize_``."""
    from torchao.quantization import quantize_  # torchao is slow to import

    factory = method(name).torchao
    if factory is None:
        raise ValueError(f"'{name}' is not a quantize_ method (it is the static PT2E flow)")
    wanted = frozenset(layers)
    quantize_(
        model,
        factory(group_size, mapping != "asymmetric"),
        filter_fn=lambda module, layer: layer in wanted and isinstance(module, nn.Linear),
    )
