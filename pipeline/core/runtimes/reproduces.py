"""What a runtime (and its export) declares it reproduces of a recipe: the one check of a recipe against it.

A recipe's stages say what they need in words that name no runtime (:meth:`ExportMirror.needs
<paretorch.pipeline.core.mirror.ExportMirror.needs>`: a precision, a quantization scheme, a stage's output, a model
form); each runtime declares, on the same axes, what it reproduces. Anything a recipe needs that the runtime
does not declare is refused with the reason (and the runtime's own note on why, where it gives one), before
any stage runs. ``None`` on an axis means everything: the runtime runs the built torch model itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from paretorch.pipeline.core.mirror import ExportMirror, Need, NeedKind

#: The model form a TorchScript source is (an ordinary module needs nothing).
TORCHSCRIPT = "torchscript"


@dataclass(frozen=True)
class Reproduces:
    """The values a runtime reproduces on each axis of :data:`~paretorch.pipeline.core.mirror.NeedKind` (None: all), and
    ``notes``: why it does not reproduce a value it leaves out (keyed by the value), as refusals say it."""

    precisions: frozenset[str] | None = None
    quantization: frozenset[str] | None = None
    groups: frozenset[str] | None = None
    stages: frozenset[str] | None = None
    outputs: frozenset[str] | None = None
    notes: Mapping[str, str] = field(default_factory=dict)

    def declared(self, kind: NeedKind) -> frozenset[str] | None:
        return {"precision": self.precisions, "quantization": self.quantization, "group": self.groups,
                "stage": self.stages, "output": self.outputs}[kind]

    def refusal(self, need: Need) -> str | None:
        """Why this runtime does not reproduce ``need`` (None: it does)."""
        declared = self.declared(need.kind)
        if declared is None or declared.intersection(need.values):
            return None
        note = next((self.notes[v] for v in need.values if v in self.notes), None)
        listed = ", ".join(sorted(declared)) or "none"
        return f"{need.what}: {note or f'not declared (its {need.kind} values: {listed})'}"

    def refusals(self, mirror: ExportMirror, scripted: bool = False) -> list[str]:
        """Every part of a recipe (``mirror``; ``scripted``: a TorchScript model) this runtime does not reproduce."""
        needs = (*mirror.needs(), *((Need("output", (TORCHSCRIPT,), "a TorchScript model"),) if scripted else ()))
        return [why for need in needs if (why := self.refusal(need)) is not None]
