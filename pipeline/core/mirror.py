"""How the export stages reproduce the torch-side compression of a recipe.

Core ML, ONNX and OpenVINO convert the *float* graph (the model before the numeric stages)
and then re-apply the recipe's compression with their own tools. Each model stage
says, in its :class:`~paretorch.pipeline.core.stage.Stage` record, what exports must do about
it, in one of three ways:

* nothing: a structural stage (prune, distill) changes the float graph itself,
  so the exports carry it by converting that graph (``mirror=None``);
* a function ``config -> ExportMirror`` holding the stage's :class:`MirrorFacts` (a numeric
  stage such as quantize or amp, or unstructured pruning whose sparsity the exports store
  compressed), each saying what a runtime must reproduce to run it (:class:`Need`: a precision,
  a quantization scheme, a stage's output), in words that name no runtime;
* :class:`NotMirrored` with the reason, which every export records.

The kinds of facts (integer weights, a reduced dtype, sparsity) are the stages' own: the
stages that produce and read them share their classes (``paretorch.stages.common``); this module knows
no stage and no runtime: each runtime declares what it reproduces
(:class:`paretorch.pipeline.core.runtimes.reproduces.Reproduces`) and a recipe needing anything undeclared is refused.
The exporters read one merged :class:`ExportMirror` (see
:func:`paretorch.pipeline.core.stage.export_mirror`) and never import a stage module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeVar

#: The axes a runtime declares what it reproduces on: compute precisions (``float32``, ``bfloat16``, ``float16``,
#: ``auto``: the device's preferred reduced dtype, ``mixed``: float32 layers kept beside a reduced dtype),
#: quantization schemes (:func:`quant_scheme`) and the group sizes of per-group ones (:func:`quant_group`), stages
#: (by name) whose output no export mirrors or that a runtime reproduces its own way (``pack``),
#: and model forms (``torchscript``).
NeedKind = Literal["precision", "quantization", "group", "stage", "output"]


def quant_scheme(bits: int | None, activations: str) -> str:
    """A quantization scheme as runtimes declare it: ``int8 weights, dynamic activations``, ``float8 weights``."""
    weights = f"int{bits} weights" if bits is not None else "float8 weights"
    return f"{weights}, {activations} activations" if bits is not None else weights


def quant_group(group_size: int) -> str:
    """A per-group quantization's group as runtimes declare it: ``groups of 128``."""
    return f"groups of {group_size}"


@dataclass(frozen=True)
class NotMirrored:
    """A numeric stage that the exports cannot reproduce; ``reason`` says why."""

    reason: str


@dataclass(frozen=True)
class Need:
    """What a recipe needs a runtime to reproduce: one of ``values`` on the ``kind`` axis; ``what`` says which
    part of the recipe needs it (``AMP (bfloat16)``), as a refusal names it."""

    kind: NeedKind
    values: tuple[str, ...]
    what: str


@dataclass(frozen=True, kw_only=True)
class MirrorFacts:
    """Base of one kind of fact a stage asks the exports to reproduce (a frozen dataclass per kind)."""

    def needs(self) -> tuple[Need, ...]:
        """What a runtime must reproduce to run these facts (none: any runtime does)."""
        return ()


F = TypeVar("F", bound=MirrorFacts)


@dataclass(frozen=True)
class ExportMirror:
    """The compression and precision policy an export reproduces: the facts of a recipe's stages.

    A stage's mirror function gives the facts it knows; :meth:`merge` combines the stages of a
    recipe in order (a later stage's facts replace an earlier one's of the same kind).
    """

    #: At most one fact of each kind, in the order the recipe's stages gave them.
    facts: tuple[MirrorFacts, ...] = ()
    #: ``"stage: reason"`` for every numeric stage the exports cannot reproduce.
    not_mirrored: tuple[str, ...] = ()

    def of(self, kind: type[F]) -> F | None:
        """The recipe's fact of ``kind`` (None: no stage gave one)."""
        for fact in self.facts:
            if isinstance(fact, kind):
                return fact
        return None

    def merge(self, other: ExportMirror) -> ExportMirror:
        """``self`` with ``other``'s facts (replacing those of the same kind); ``not_mirrored`` notes accumulate."""
        replaced = {type(fact) for fact in other.facts}
        kept = tuple(fact for fact in self.facts if type(fact) not in replaced)
        return ExportMirror((*kept, *other.facts), (*self.not_mirrored, *other.not_mirrored))

    def without(self, kind: type[MirrorFacts]) -> ExportMirror:
        """The recipe as an export sees it that leaves facts of ``kind`` out (e.g. ``quantize="none"``)."""
        return ExportMirror(tuple(f for f in self.facts if not isinstance(f, kind)), self.not_mirrored)

    def needs(self) -> tuple[Need, ...]:
        """What a runtime must reproduce to run the recipe: its facts' needs, and each stage marked not mirrored
        (only a runtime that runs the torch model itself reproduces those)."""
        marked = (Need("stage", (note.split(":", 1)[0],), note) for note in self.not_mirrored)
        return (*(need for fact in self.facts for need in fact.needs()), *marked)
