"""A study ready for its trials (:meth:`paretorch.pipeline.search.study.Search.prepare`): its baseline, and the lines
the console prints before the first trial."""

from __future__ import annotations

from dataclasses import dataclass

from paretorch.pipeline.search.objectives import Baseline


@dataclass(frozen=True)
class Prepared:
    """A study ready for its trials: its baseline, and what the console says first (None: nothing to say)."""

    baseline: Baseline
    #: The unoptimized model's self-check (:func:`paretorch.pipeline.core.self_check.require_stable`).
    self_check_line: str | None = None
    #: What changed in a resumed study's stages (:func:`paretorch.pipeline.search.study_names.stage_change`).
    stages_line: str | None = None
    #: The precision presets enqueued first (:mod:`paretorch.pipeline.search.presets`).
    presets_line: str | None = None
    #: What pays on this machine (:mod:`paretorch.pipeline.core.machine_probe`).
    probe_line: str | None = None
    #: The metric at its noise floor (:mod:`paretorch.pipeline.core.noise_floor`; None: it is not).
    noise_line: str | None = None

    def lines(self) -> list[str]:
        """The lines to print, in order: the self-check, the noise floor, the stages' changes, the machine probe, the
        presets."""
        return [line for line in (self.self_check_line, self.noise_line, self.stages_line, self.probe_line,
                                  self.presets_line) if line]
