"""How the export stages reproduce the torch-side compression of a recipe.

Core ML, ONNX and OpenVINO convert the *float* graph (the model before the numeric stages)
and then re-apply the recipe's compression with their own tools. Each model stage
says, in its :class:`~pipeline.core.stage.Stage` record, what exports must do about
it, in one of three ways:

* nothing: a structural stage (prune, distill) changes the float graph itself,
  so the exports carry it by converting that graph (``mirror=None``);
* a function ``config -> ExportMirror`` holding the stage's :class:`MirrorFacts` (a numeric
  stage such as quantize or amp, or unstructured pruning whose sparsity the exports store
  compressed), each naming the exported runtimes that cannot reproduce it and why;
* :class:`NotMirrored` with the reason, which every export records.

The kinds of facts (integer weights, a reduced dtype, sparsity) are the stages' own: the
stages that produce and read them share their classes (``stages.common``); this module knows
no stage. The exporters read one merged :class:`ExportMirror` (see
:func:`pipeline.core.stage.export_mirror`) and never import a stage module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar


@dataclass(frozen=True)
class NotMirrored:
    """A numeric stage that the exports cannot reproduce; ``reason`` says why."""

    reason: str


@dataclass(frozen=True)
class RuntimeGap:
    """An exported runtime (its registry name, e.g. ``onnxruntime``) that does not reproduce a fact, and why."""

    runtime: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class MirrorFacts:
    """Base of one kind of fact a stage asks the exports to reproduce (a frozen dataclass per kind).

    ``gaps``: the exported runtimes that cannot reproduce these facts, each with why (a runtime may be
    named more than once); a runtime not named reproduces them."""

    gaps: tuple[RuntimeGap, ...] = ()

    def unmirrored(self, runtime: str) -> list[str]:
        """Why ``runtime`` does not reproduce these facts (empty: it does)."""
        return [gap.reason for gap in self.gaps if gap.runtime == runtime]


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

    def unmirrored(self, runtime: str) -> list[str]:
        """What of the recipe's numerics ``runtime`` does not reproduce (empty: all of it), stages marked
        not mirrored included."""
        return [reason for fact in self.facts for reason in fact.unmirrored(runtime)] + list(self.not_mirrored)
