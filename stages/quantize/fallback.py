"""Accuracy-aware quantization: which selected layers stay float to hold an output-error budget.

The switches hand :func:`paretorch.stages.common.sensitivity.calibrate` a copy of the model whose
selected layers can each be quantized or float:

* :class:`QuantizedSwap` (torchao ``quantize_`` methods): the layers of a fully
  quantized copy are swapped in and out, so the measured error is the real one.
* :class:`SimulatedStaticInt8` (``int8_static_pt2e``, whose graph cannot be changed layer
  by layer without re-exporting): the x86 inductor recipe simulated in float, int8
  symmetric per-channel weights and uint8 affine per-tensor inputs (ranges observed on the
  calibration batches). The stage measures the real PT2E model's error afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from paretorch.pipeline.core.spec import Batch


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    owner, _, attr = name.rpartition(".")
    setattr(model.get_submodule(owner) if owner else model, attr, module)


class QuantizedSwap:
    """A copy of ``model`` whose ``layers`` are swapped between float and quantized modules."""

    def __init__(self, model: nn.Module, layers: Sequence[str], quantize: Callable[[nn.Module], None]) -> None:
        self.model = copy.deepcopy(model)
        quantized = copy.deepcopy(model)
        quantize(quantized)
        self._float = {name: self.model.get_submodule(name) for name in layers}
        self._quantized = {name: quantized.get_submodule(name) for name in layers}

    def set_changed(self, names: Iterable[str]) -> None:
        """Quantize exactly ``names``; every other layer float."""
        target = set(names)
        for name, module in self._float.items():
            _set_submodule(self.model, name, self._quantized[name] if name in target else module)


def _fake_quantize_weight(weight: Tensor) -> Tensor:
    """Symmetric int8 per output channel (dim 0), back in float."""
    amax = weight.detach().abs().flatten(1).amax(dim=1).clamp_min(1e-12)
    scale = (amax / 127.0).float()
    zero = torch.zeros_like(scale, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(weight.detach().float(), scale, zero, 0, -128, 127).to(weight.dtype)


def _input_fake_quant(low: float, high: float) -> Callable[[nn.Module, tuple[object, ...]], tuple[object, ...]]:
    """A forward pre-hook: uint8 affine per-tensor fake quantization of the first input."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = max((high - low) / 255.0, 1e-12)
    zero_point = int(min(255, max(0, round(-low / scale))))

    def hook(_module: nn.Module, args: tuple[object, ...]) -> tuple[object, ...]:
        first = args[0]
        if not isinstance(first, Tensor):
            return args
        return (torch.fake_quantize_per_tensor_affine(first, scale, zero_point, 0, 255), *args[1:])

    return hook


def _weight(module: nn.Module) -> Tensor:
    weight = module.weight
    if not isinstance(weight, Tensor):
        raise TypeError(f"{type(module).__name__} has no weight tensor")
    return weight


class SimulatedStaticInt8:
    """A copy of ``model`` whose ``layers`` can each run the simulated static int8 recipe."""

    def __init__(self, model: nn.Module, layers: Sequence[str], batches: Sequence[Batch]) -> None:
        self.model = copy.deepcopy(model)
        self._modules = {name: self.model.get_submodule(name) for name in layers}
        self._ranges = self._observe(batches)
        self._float = {name: _weight(m).detach().clone() for name, m in self._modules.items()}
        self._fake = {name: _fake_quantize_weight(_weight(m)) for name, m in self._modules.items()}
        self._hooks: dict[str, RemovableHandle] = {}

    def _observe(self, batches: Sequence[Batch]) -> dict[str, tuple[float, float]]:
        ranges: dict[str, tuple[float, float]] = {}

        def observer(name: str) -> Callable[[nn.Module, tuple[object, ...]], None]:
            def hook(_module: nn.Module, args: tuple[object, ...]) -> None:
                if args and isinstance(args[0], Tensor):
                    low, high = float(args[0].min()), float(args[0].max())
                    old = ranges.get(name, (low, high))
                    ranges[name] = (min(old[0], low), max(old[1], high))

            return hook

        handles = [m.register_forward_pre_hook(observer(name)) for name, m in self._modules.items()]
        try:
            with torch.no_grad():
                for batch in batches:
                    self.model(*batch)
        finally:
            for handle in handles:
                handle.remove()
        return ranges

    def set_changed(self, names: Iterable[str]) -> None:
        """Simulate int8 in exactly ``names``; every other layer float."""
        target = set(names)
        with torch.no_grad():
            for name, module in self._modules.items():
                quantize = name in target
                _weight(module).copy_(self._fake[name] if quantize else self._float[name])
                handle = self._hooks.pop(name, None)
                if handle is not None:
                    handle.remove()
                if quantize and name in self._ranges:
                    self._hooks[name] = module.register_forward_pre_hook(_input_fake_quant(*self._ranges[name]))
