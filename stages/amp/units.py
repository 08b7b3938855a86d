"""The layers a precision policy is made of ("units"), found once per model.

A unit is a module that owns floating parameters and is switched as a whole:

* a module holding parameters whose children hold none (Linear, Conv, norms,
  Embedding, ... and custom leaf layers);
* a ``torch.nn`` module that holds parameters itself *and* has children with
  parameters (``nn.MultiheadAttention`` reads its ``out_proj`` weight directly, so
  the two must share one dtype): the whole subtree is one unit.

Parameters of the root module and of custom containers that also have children
with parameters are never switched: they stay as they are. A unit that cannot be
reduced safely is *pinned* to float32 (with the reason): protected by the spec,
holding tensor subclasses (weights already quantized by torchao), or sharing a
tensor with another unit (tied weights must keep one dtype).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from paretorch.pipeline.core.errors import ConfigError

_PLAIN_TENSOR_TYPES = (Tensor, nn.Parameter)


@dataclass(frozen=True)
class PrecisionUnits:
    """Every unit of one model, by name in module order, and which ones are pinned."""

    modules: dict[str, nn.Module]
    #: Units pinned to float32, each to the reason.
    pinned: dict[str, str]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.modules)

    @property
    def candidates(self) -> tuple[str, ...]:
        """Units calibration may run in the reduced dtype, in module order."""
        return tuple(name for name in self.modules if name not in self.pinned)

    def in_model_order(self, names: Iterable[str]) -> tuple[str, ...]:
        wanted = set(names)
        return tuple(name for name in self.modules if name in wanted)

    def units_for(self, layer_names: Sequence[str]) -> set[str]:
        """Units covered by ``layer_names``: a name selects the unit it names, the units
        below it (``"classifier"`` selects ``classifier.1`` and ``classifier.3``) and the
        unit above it (``"attn.out_proj"`` selects the unit ``attn``). A name that is not
        a module of the model is a :class:`ConfigError`."""
        selected: set[str] = set()
        unknown: list[str] = []
        for layer in layer_names:
            matches = {unit for unit in self.modules if _related(unit, layer)}
            if not matches:
                unknown.append(layer)
            selected |= matches
        if unknown:
            known = ", ".join(self.names[:12]) + (", ..." if len(self.modules) > 12 else "")
            raise ConfigError(
                f"amp: fp32_layers names no layer with parameters of this model: {', '.join(unknown)} "
                f"(layers are: {known})"
            )
        return selected


def _related(unit: str, layer: str) -> bool:
    return unit == layer or unit.startswith(layer + ".") or layer.startswith(unit + ".")


def unit_tensors(module: nn.Module) -> Iterator[tuple[nn.Module, str, bool, Tensor]]:
    """``(owner, attribute, is_parameter, tensor)`` for every floating parameter and buffer
    of ``module`` and its children."""
    for owner in module.modules():
        for attr, param in owner._parameters.items():
            if param is not None and param.is_floating_point():
                yield owner, attr, True, param
        for attr, buffer in owner._buffers.items():
            if buffer is not None and buffer.is_floating_point():
                yield owner, attr, False, buffer


def find_precision_units(model: nn.Module, protected: Sequence[str] = ()) -> PrecisionUnits:
    """The units of ``model`` in module order; ``protected`` names (and the units above or
    below them) are pinned to float32."""
    found: list[tuple[str, nn.Module]] = []
    _collect_units("", model, found, seen=set())
    modules = dict(found)
    pinned: dict[str, str] = {}
    owner_of_tensor: dict[int, str] = {}
    for name, module in found:
        for _, _, _, tensor in unit_tensors(module):
            if type(tensor) not in _PLAIN_TENSOR_TYPES:
                pinned.setdefault(name, f"holds a {type(tensor).__name__} (already quantized); kept as it is")
            other = owner_of_tensor.setdefault(id(tensor), name)
            if other != name:
                pinned.setdefault(name, f"shares a tensor with {other} (tied weights keep one dtype)")
                pinned.setdefault(other, f"shares a tensor with {name} (tied weights keep one dtype)")
        if any(_related(name, layer) for layer in protected):
            pinned.setdefault(name, "protected by the model spec")
    return PrecisionUnits(modules=modules, pinned=pinned)


def _collect_units(prefix: str, module: nn.Module, found: list[tuple[str, nn.Module]], seen: set[int]) -> None:
    if id(module) in seen:  # a module used at two places is one unit, under its first name
        return
    seen.add(id(module))
    owns = any(p is not None and p.is_floating_point() for p in module._parameters.values())
    children_own = any(p.is_floating_point() for child in module.children() for p in child.parameters())
    if prefix and owns and (not children_own or _is_torch_nn_module(module)):
        found.append((prefix, module))
        return
    for name, child in module.named_children():
        _collect_units(f"{prefix}.{name}" if prefix else name, child, found, seen)


def _is_torch_nn_module(module: nn.Module) -> bool:
    return type(module).__module__.startswith("torch.nn.")
