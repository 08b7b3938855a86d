"""Cheap facts about the unoptimized model, read once per study before any trial runs.

A stage reads its own facts (``Stage.facts``: e.g. the layers the quantize methods could
touch, the blocks depth pruning could remove) and rules a config out against them
(``Stage.rules_out``) before any node of a trial's chain executes, so a configuration that
cannot change this model never costs a trial, nor the costly stages before it.
:class:`ModelFacts` holds them: what every stage may read (is the model TorchScript?) plus each
stage's own facts by stage name, and, for a stage whose facts could not be read, why (nothing
is ruled out for that stage then).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch import nn

#: Why a stage that rewrites Python modules cannot act on a TorchScript model (the user-level reason).
SCRIPTED_REASON = ("the model is TorchScript: its layers are compiled code that {what}; give the Python "
                   "model (a spec) or a torch.export .pt2 file instead")


@dataclass(frozen=True)
class ModelFacts:
    """What the stages know about the unoptimized model before any trial (see the module docstring)."""

    #: The model is a ``torch.jit.ScriptModule``: no forward hooks, no module rewriting, no training.
    scripted: bool
    #: Each stage's own facts (the value its ``Stage.facts`` returned), by stage name.
    stages: Mapping[str, object] = field(default_factory=dict)
    #: Stages whose facts could not be read, with why (nothing is ruled out for them).
    unknown: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", MappingProxyType(dict(self.stages)))
        object.__setattr__(self, "unknown", MappingProxyType(dict(self.unknown)))

    def of(self, stage: str) -> object:
        """The facts ``stage`` read about the model (None: it reads none, or they are unknown)."""
        return self.stages.get(stage)

    def scripted_reason(self, what: str) -> str | None:
        """For a TorchScript model, the user-level reason a stage that ``what`` cannot act on it; else None."""
        return SCRIPTED_REASON.format(what=what) if self.scripted else None


def is_scripted(model: nn.Module) -> bool:
    """Whether ``model`` is TorchScript (``torch.jit.script`` / ``trace`` / ``load``)."""
    return isinstance(model, torch.jit.ScriptModule)
