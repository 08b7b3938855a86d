"""Set a precision policy on a model in place, as many times as calibration needs.

Two shapes of policy (:mod:`paretorch.stages.amp.casting` has the casts):

* **full** (every unit reduced, none pinned): exactly a whole-model cast. Every floating
  parameter and buffer of the model is in the reduced dtype, those of the root module
  and of containers outside every unit included (what ``model.to(dtype)`` does); the
  model boundary casts floating inputs to the reduced dtype and floating outputs to
  float32; there is no per-layer cast at all.
* **partial**: reduced units hold their floating parameters and buffers in the reduced
  dtype, every other floating tensor stays float32; each unit casts its floating inputs
  to its own dtype (a forward pre-hook); the boundary casts floating outputs to float32.
  :meth:`PrecisionSwitch.keep_needed_casts` then removes the pre-hooks of the units whose
  inputs already arrive in their dtype, so the model casts only where the dtype changes.

Switching a unit back restores the float32 tensors kept aside, so no precision is lost
between calibration steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from paretorch.stages.amp.casting import floating_dtypes, input_cast_hook, set_boundary
from paretorch.stages.amp.units import PrecisionUnits, unit_tensors


@dataclass(frozen=True)
class _Slot:
    """One floating parameter or buffer, with its original float32 tensor."""

    owner: nn.Module
    attr: str
    is_parameter: bool
    original: Tensor

    def converted(self, dtype: torch.dtype, made: dict[int, Tensor]) -> Tensor:
        """``original`` in ``dtype``; ``made`` (by id of the original) keeps a tensor two
        owners share one tensor after the cast, as ``model.to(dtype)`` does."""
        tensor = made.get(id(self.original))
        if tensor is None:
            if self.is_parameter:
                tensor = nn.Parameter(self.original.detach().to(dtype), requires_grad=self.original.requires_grad)
            else:
                tensor = self.original.to(dtype)
            made[id(self.original)] = tensor
        return tensor

    def put(self, tensor: Tensor) -> None:
        if self.is_parameter:
            self.owner._parameters[self.attr] = tensor  # type: ignore[assignment]
        else:
            self.owner._buffers[self.attr] = tensor


class _SlotGroup:
    """Slots switched together, with their reduced tensors made once."""

    def __init__(self, slots: list[_Slot], reduced_dtype: torch.dtype, made: dict[int, Tensor]) -> None:
        self.slots = slots
        self.reduced_dtype = reduced_dtype
        self._made = made
        self._reduced: list[Tensor] | None = None

    def put(self, reduce: bool) -> None:
        if reduce and self._reduced is None:
            self._reduced = [slot.converted(self.reduced_dtype, self._made) for slot in self.slots]
        tensors = self._reduced if reduce and self._reduced is not None else [slot.original for slot in self.slots]
        for slot, tensor in zip(self.slots, tensors, strict=True):
            slot.put(tensor)


class PrecisionSwitch:
    """Holds one model and moves its candidate units between float32 and ``reduced_dtype``.

    Pinned units keep their tensors and compute in float32; so does everything outside
    the units unless the policy is full (module docstring).
    """

    def __init__(self, model: nn.Module, units: PrecisionUnits, reduced_dtype: torch.dtype) -> None:
        self.model = model
        self.units = units
        self.reduced_dtype = reduced_dtype
        made: dict[int, Tensor] = {}  # reduced tensors by id of their float32 original
        self._units = {
            name: _SlotGroup([_Slot(*entry) for entry in unit_tensors(units.modules[name])], reduced_dtype, made)
            for name in units.candidates
        }
        self._outside = _SlotGroup(_outside_slots(model, units), reduced_dtype, made)
        self._reduced: set[str] = set()
        self._full = False
        self._input_hooks: dict[str, tuple[torch.dtype, RemovableHandle]] = {}
        self._set_casts()

    @property
    def full(self) -> bool:
        """Whether the policy now is a whole-model cast (every unit reduced, none pinned)."""
        return self._full

    def fp32_units(self) -> tuple[str, ...]:
        """Every unit that computes in float32 now (pinned ones included), in module order."""
        return tuple(name for name in self.units.names if name not in self._reduced)

    def cast_units(self) -> tuple[str, ...]:
        """The units that cast their floating inputs to their own dtype, in module order."""
        return self.units.in_model_order(self._input_hooks)

    def set_reduced(self, names: Iterable[str]) -> None:
        """Run exactly ``names`` (candidates) in the reduced dtype, all other units in float32."""
        target = set(names)
        unknown = target - set(self.units.candidates)
        if unknown:
            raise ValueError(f"not reducible units: {', '.join(sorted(unknown))}")
        for name in self.units.candidates:
            if (name in target) != (name in self._reduced):
                self._units[name].put(reduce=name in target)
        self._reduced = target
        self._full = not self.units.pinned and target == set(self.units.candidates)
        self._outside.put(reduce=self._full)
        self._set_casts()

    def set_changed(self, names: Iterable[str]) -> None:
        """:meth:`set_reduced` under the name :class:`paretorch.stages.common.sensitivity.UnitSwitch` uses."""
        self.set_reduced(names)

    def keep_needed_casts(self, forward: Callable[[], object]) -> None:
        """Run ``forward`` (a forward pass of the model) and remove the input casts of the
        units whose floating inputs all arrived in the unit's dtype. A unit the pass does not
        reach keeps its cast."""
        arrived: dict[str, set[torch.dtype]] = {}
        probes = [
            self.units.modules[name].register_forward_pre_hook(_DtypeProbe(arrived, name), prepend=True,
                                                               with_kwargs=True)
            for name in self._input_hooks
        ]
        try:
            forward()
        finally:
            for probe in probes:
                probe.remove()
        for name in list(self._input_hooks):
            dtype, handle = self._input_hooks[name]
            if name in arrived and arrived[name] <= {dtype}:
                handle.remove()
                del self._input_hooks[name]

    def _unit_dtype(self, name: str) -> torch.dtype:
        return self.reduced_dtype if name in self._reduced else torch.float32

    def _set_casts(self) -> None:
        """The full policy: the boundary casts, no layer cast; partial: a cast on every unit."""
        set_boundary(self.model, self.reduced_dtype if self._full else None)
        wanted = {} if self._full else {name: self._unit_dtype(name) for name in self.units.names}
        for name in list(self._input_hooks):
            dtype, handle = self._input_hooks[name]
            if wanted.get(name) != dtype:
                handle.remove()
                del self._input_hooks[name]
        for name, dtype in wanted.items():
            if name not in self._input_hooks:
                module = self.units.modules[name]
                handle = module.register_forward_pre_hook(input_cast_hook(dtype), with_kwargs=True)
                self._input_hooks[name] = (dtype, handle)


@dataclass(frozen=True)
class _DtypeProbe:
    """Forward pre-hook: records the dtypes of a unit's floating inputs."""

    arrived: dict[str, set[torch.dtype]]
    name: str

    def __call__(self, module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        self.arrived.setdefault(self.name, set()).update(floating_dtypes((args, kwargs)))


def _outside_slots(model: nn.Module, units: PrecisionUnits) -> list[_Slot]:
    """The floating parameters and buffers of ``model`` that belong to no unit."""
    inside = {(id(owner), attr) for module in units.modules.values() for owner, attr, _, _ in unit_tensors(module)}
    return [_Slot(*entry) for entry in unit_tensors(model) if (id(entry[0]), entry[1]) not in inside]
