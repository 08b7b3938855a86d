"""Set a precision policy on a model in place, as many times as calibration needs.

Every unit gets a forward pre-hook casting its floating inputs to its dtype
(float32 or the reduced dtype). A reduced unit holds its parameters and floating
buffers in the reduced dtype; switching it back restores the float32 tensors
kept aside, so no precision is lost between calibration steps. The model's
floating outputs come back as float32: through a forward hook on the units that
produce them when that is known (no extra frame under ``torch.compile``), else
through a forward hook on the root module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from stages.amp.casting import cast_floating_outputs_to_float32, input_cast_hook
from stages.amp.units import PrecisionUnits, unit_tensors


@dataclass(frozen=True)
class _Slot:
    """One floating parameter or buffer of a unit, with its original float32 tensor."""

    owner: nn.Module
    attr: str
    is_parameter: bool
    original: Tensor

    def converted(self, dtype: torch.dtype) -> Tensor:
        if self.is_parameter:
            return nn.Parameter(self.original.detach().to(dtype), requires_grad=self.original.requires_grad)
        return self.original.to(dtype)

    def put(self, tensor: Tensor) -> None:
        if self.is_parameter:
            self.owner._parameters[self.attr] = tensor  # type: ignore[assignment]
        else:
            self.owner._buffers[self.attr] = tensor


class PrecisionSwitch:
    """Holds one model and moves its candidate units between float32 and ``reduced_dtype``.

    Pinned units keep their tensors and get a float32 input cast. ``output_unit_names``
    (see :func:`stages.amp.units.output_units`) are the units whose
    outputs are the model's outputs; None makes the root module cast its outputs.
    """

    def __init__(
        self,
        model: nn.Module,
        units: PrecisionUnits,
        reduced_dtype: torch.dtype,
        output_unit_names: tuple[str, ...] | None,
    ) -> None:
        self.model = model
        self.units = units
        self.reduced_dtype = reduced_dtype
        self._output_units = set(output_unit_names or ())
        self._slots = {
            name: [_Slot(*entry) for entry in unit_tensors(units.modules[name])] for name in units.candidates
        }
        self._reduced_tensors: dict[str, list[Tensor]] = {}
        self._reduced: set[str] = set()
        self._input_hooks: dict[str, RemovableHandle] = {}
        self._output_hooks: dict[str, RemovableHandle] = {}
        for name in units.names:
            self._set_input_hook(name, torch.float32)
        if output_unit_names is None:
            model.register_forward_hook(cast_floating_outputs_to_float32)

    def fp32_units(self) -> tuple[str, ...]:
        """Every unit that computes in float32 now (pinned ones included), in module order."""
        return tuple(name for name in self.units.names if name not in self._reduced)

    def set_reduced(self, names: Iterable[str]) -> None:
        """Run exactly ``names`` (candidates) in the reduced dtype, all other units in float32."""
        target = set(names)
        unknown = target - set(self.units.candidates)
        if unknown:
            raise ValueError(f"not reducible units: {', '.join(sorted(unknown))}")
        for name in self.units.candidates:
            if (name in target) != (name in self._reduced):
                self._switch(name, reduce=name in target)

    def set_changed(self, names: Iterable[str]) -> None:
        """:meth:`set_reduced` under the name :class:`stages.common.sensitivity.UnitSwitch` uses."""
        self.set_reduced(names)

    def _switch(self, name: str, reduce: bool) -> None:
        slots = self._slots[name]
        if reduce:
            tensors = self._reduced_tensors.get(name)
            if tensors is None:
                tensors = self._reduced_tensors[name] = [slot.converted(self.reduced_dtype) for slot in slots]
            for slot, tensor in zip(slots, tensors, strict=True):
                slot.put(tensor)
            self._reduced.add(name)
        else:
            for slot in slots:
                slot.put(slot.original)
            self._reduced.discard(name)
        self._set_input_hook(name, self.reduced_dtype if reduce else torch.float32)
        if name in self._output_units:
            handle = self._output_hooks.pop(name, None)
            if handle is not None:
                handle.remove()
            if reduce:
                module = self.units.modules[name]
                self._output_hooks[name] = module.register_forward_hook(cast_floating_outputs_to_float32)

    def _set_input_hook(self, name: str, dtype: torch.dtype) -> None:
        handle = self._input_hooks.pop(name, None)
        if handle is not None:
            handle.remove()
        module = self.units.modules[name]
        self._input_hooks[name] = module.register_forward_pre_hook(input_cast_hook(dtype), with_kwargs=True)
