"""Facts about a model that pruning needs: its output head, its protected
layers, its output shapes, and whether a pruned copy still runs."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig
from paretorch.pipeline.core.spec import Batch
from paretorch.stages.common.layer_outputs import forward_with_layer_outputs

#: Layers that pruning removes channels from or zeroes weights in.
WEIGHT_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.modules.conv._ConvNd)


def find_output_head(model: nn.Module, inputs: Batch) -> str | None:
    """Name of the Linear/Conv layer that produces the model output.

    One forward pass on ``inputs`` with hooks on every Linear/Conv layer: the
    layer whose output tensor *is* the model output (or its first tensor) wins;
    if none is (the output is pooled or normalized after the last layer), the
    last Linear/Conv layer called in forward order is the head. None when the
    model has no such layer.
    """
    layers = {name: m for name, m in model.named_modules() if isinstance(m, WEIGHT_LAYERS)}
    output, calls = forward_with_layer_outputs(model, inputs, layers)
    if not calls:
        return None
    first_output = next(iter(tensors_in(output)), None)
    for name, layer_output in reversed(calls):
        if layer_output is output or (first_output is not None and layer_output is first_output):
            return name
    return calls[-1][0]


def protected_modules(model: nn.Module, names: Iterable[str]) -> dict[str, nn.Module]:
    """The modules called ``names`` in ``model``; an unknown name is a :class:`ConfigError`."""
    by_name = dict(model.named_modules())
    found: dict[str, nn.Module] = {}
    for name in names:
        if name not in by_name:
            known = ", ".join(n for n in by_name if n and isinstance(by_name[n], WEIGHT_LAYERS))
            raise ConfigError(f"protected layer '{name}' is not a module of the model; its weight layers are: {known}")
        found[name] = by_name[name]
    return found


def output_shapes(output: object) -> list[tuple[int, ...]]:
    """Shapes of every tensor in a model output (tensor, tuple, list or dict, nested)."""
    return [tuple(t.shape) for t in tensors_in(output)]


def tensors_in(output: object) -> list[Tensor]:
    """Every tensor in a model output (tensor, tuple, list or dict, nested), in order."""
    if isinstance(output, Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for value in output.values() for t in tensors_in(value)]
    if isinstance(output, (tuple, list)):
        return [t for value in output for t in tensors_in(value)]
    return []


def reference_shapes(model: nn.Module, inputs: Batch) -> list[tuple[int, ...]]:
    """Output shapes of the unpruned model on ``inputs``."""
    with torch.no_grad():
        return output_shapes(model(*inputs))


def check_pruned_forward(model: nn.Module, inputs: Batch, expected: list[tuple[int, ...]], what: str) -> None:
    """Raise :class:`InfeasibleConfig` unless ``model(*inputs)`` runs, gives the
    ``expected`` output shapes and finite values."""
    try:
        with torch.no_grad():
            output = model(*inputs)
    except Exception as exc:  # any failure of the pruned graph makes the config infeasible
        raise InfeasibleConfig(f"{what}: the pruned model's forward pass fails: {type(exc).__name__}: {exc}") from exc
    shapes = output_shapes(output)
    if shapes != expected:
        raise InfeasibleConfig(f"{what}: the pruned model's output shapes changed from {expected} to {shapes}")
    if not all(bool(torch.isfinite(t).all()) for t in tensors_in(output) if t.is_floating_point()):
        raise InfeasibleConfig(f"{what}: the pruned model's output contains NaN or infinity")
