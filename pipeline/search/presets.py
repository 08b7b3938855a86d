"""Cheap, strong paths first: every runtime with each precision preset alone, before any costly stage.

A *preset* (the search config's ``presets``, ``pipeline/defaults/search.yaml``) is a short list of
stage configs that costs no training and no long calibration: float32 as it is, every layer in a fast
reduced dtype, int8. :func:`preset_seeds` crosses the presets with the study's runtimes (the search
config's runtimes that the registry, :func:`paretorch.pipeline.core.runtimes.registry.available_runtimes`, says
run on the device), preset-major: the first preset under its runtimes, then the next. A preset that names
its ``runtimes`` runs under those the study offers, in that order (where it can pay: PT2E int8 under eager
runs reference kernels, slower than float32, and costs a trial); one that names none runs under every
runtime of the study, eager (the baseline's runtime, the reference every other runtime is there to beat)
last. A pair that
cannot be a trial here is skipped with its reason, never enqueued: a stage not in the pipeline (or not
installed, e.g. ``pack``), one the capability table calls slower only or the device cannot run, one the
model's facts rule out (``pack`` on a model without a padding mask), a runtime that cannot run the
chain (:meth:`paretorch.pipeline.core.runtimes.base.Runtime.cannot_run`: ONNX Runtime with AMP). A runtime that
registers later (OpenVINO, a dynamic-shape compile) gets its presets with no change here.

The study enqueues these right after the baseline and before the config's ``seeds`` (which may hold a
costly stage, such as distillation), so a search has the one-line paths' level within its first trials.
Where the machine probe finds a reduced precision that pays (its median: a probe that did not decide orders but
never drops), only each such preset under its first runtime (the preset's own order: static int8 under OpenVINO;
bfloat16 and float16 alike: on a GPU ``pack + bf16 | compile_cudagraphs`` is among the first trials) and the
structural presets (float32 ``pack``, which multiplies with a reduced precision) come first; the cheap seeds (no
costly stage: depth pruning) follow at once, so the first compositions (``prune depth + int8s | ov``) are measured
within minutes, and the other presets (int8 under its other runtimes among them) and the costly seeds wait
(:func:`initial_queue`: they are enqueued when the queue runs dry and the compositions and the runtime sweep have
nothing to add, :mod:`paretorch.pipeline.search.proposals`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import optuna

from paretorch.pipeline.core.machine_probe import MachineProbe, stage_precision
from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.stage import config_from_dict
from paretorch.pipeline.search.config import Preset, SeedRecipe
from paretorch.pipeline.search.objectives import ATTR_SEED_RECIPE

#: Seed names of preset trials start with this: ``preset-<preset>@<runtime>``.
PRESET_PREFIX = "preset-"
#: Study user attr: the seeds that wait until the queue runs dry (:func:`initial_queue`), as SeedRecipe dicts.
ATTR_LATER_SEEDS = "paretorch.later_seeds"
#: The precisions the machine probe times against float32.
REDUCED = ("int8", "bf16", "fp16")
#: The baseline's runtime: last within each preset.
REFERENCE_RUNTIME = DEFAULT_RUNTIME

#: How many distinct skip reasons the presets' line names, and how long each may be.
REASONS_SHOWN, REASON_CHARS = 3, 160
#: Study user attr: every skipped preset pair with its reason.
ATTR_SKIPPED_PRESETS = "paretorch.skipped_presets"
#: Why a seed's stages (as dicts) cannot be a trial under a runtime here; None: they can.
SkipReason = Callable[[tuple[dict[str, object], ...], str], str | None]


@dataclass(frozen=True)
class PresetPlan:
    """The preset trials to enqueue, in order, and the pairs skipped with their reasons."""

    seeds: list[SeedRecipe] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    #: The presets that wait for the first compositions (a reduced precision pays here, and these are not the
    #: first runtime of a preset that pays).
    later: list[SeedRecipe] = field(default_factory=list)

    def describe(self, enqueued: Sequence[SeedRecipe], waiting: Sequence[SeedRecipe] = ()) -> str | None:
        """The console line, naming the ``enqueued`` seeds (the study skips one that repeats a trial, such as
        float32 under eager, the baseline) and the ``waiting`` ones; None when there are no presets."""
        if not self.seeds and not self.skipped:
            return None
        names = ", ".join(s.name.removeprefix(PRESET_PREFIX) for s in enqueued) or "none"
        line = f"presets first ({len(enqueued)} trial(s), each alone, before costly stages): {names}"
        if waiting:
            line += (f"; {len(waiting)} more after the cheap seeds and the first compositions: "
                     + ", ".join(s.name.removeprefix(PRESET_PREFIX) for s in waiting))
        if self.skipped:
            line += f"; {len(self.skipped)} pair(s) skipped as they cannot run here: {self.skip_reasons()}"
        return line

    def skip_reasons(self) -> str:
        """Each distinct reason a pair was skipped, once, with its count, the commonest first (at most
        :data:`REASONS_SHOWN`; each cut to :data:`REASON_CHARS`): a stage that cannot apply to this model says why
        at the start of the study, not per trial."""
        counted = Counter(self.skipped.values()).most_common()
        shown = [f"{_cut(reason)} ({count})" for reason, count in counted[:REASONS_SHOWN]]
        more = len(counted) - REASONS_SHOWN
        return "; ".join(shown) + (f"; {more} other reason(s) (Optuna attr {ATTR_SKIPPED_PRESETS})" if more > 0 else "")


def _cut(reason: str) -> str:
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 3] + "..."


def is_preset(seed: str | None) -> bool:
    """Whether a trial's seed name is a preset's (:func:`preset_name`)."""
    return seed is not None and seed.startswith(PRESET_PREFIX)


def preset_name(preset: str, runtime: str) -> str:
    """The seed name of ``preset`` under ``runtime``."""
    return f"{PRESET_PREFIX}{preset}@{runtime}"


def reduced(seed_stages: tuple[dict[str, object], ...]) -> str | None:
    """The reduced precision a preset's stages run in (``int8``, ``bf16``, ``fp16``; None: float32 or a
    quantization the probe does not time)."""
    precision = stage_precision(seed_stages)
    return precision if precision in REDUCED else None


def preset_rank(preset: Preset, runtimes: Sequence[str], probe: MachineProbe | None) -> int:
    """Where the machine probe puts a preset: a reduced precision whose median pays under one of its runtimes
    first (0), then the others (1), a reduced precision that pays under none of them last (2); without a probe,
    the config's order (all 1)."""
    precision = reduced(preset.stages)
    if probe is None or precision is None:
        return 1
    mine = runtimes if preset.runtimes is None else [r for r in preset.runtimes if r in runtimes]
    verdicts = [probe.likely_pays(r, precision) for r in mine]
    if any(verdicts):
        return 0
    return 2 if any(v is False for v in verdicts) else 1


def preset_seeds(presets: Sequence[Preset], runtimes: Sequence[str], skip: SkipReason,
                 probe: MachineProbe | None = None) -> PresetPlan:
    """Each preset under its runtimes among the study's ``runtimes`` (preset-major; a preset's own order, else
    the study's with :data:`REFERENCE_RUNTIME` last), minus the pairs ``skip`` gives a reason for; the presets
    ordered by the machine ``probe`` (:func:`preset_rank`: a reduced precision first where it pays), else as
    configured."""
    plan = PresetPlan()
    ordered = sorted(runtimes, key=lambda runtime: runtime == REFERENCE_RUNTIME)  # stable: the rest keep their order
    for preset in sorted(presets, key=lambda p: preset_rank(p, runtimes, probe)):
        mine = ordered if preset.runtimes is None else [r for r in preset.runtimes if r in runtimes]
        for runtime in mine:
            name = preset_name(preset.name, runtime)
            reason = skip(preset.stages, runtime)
            if reason is not None:
                plan.skipped[name] = reason
                continue
            plan.seeds.append(SeedRecipe(name=name, runtime=runtime, stages=preset.stages))
    paying = [s for s in plan.seeds if probe is not None and (precision := reduced(s.stages)) is not None
              and probe.likely_pays(s.runtime, precision)]
    if paying:  # a reduced precision pays here: each such preset under its first runtime (with the structural
        # presets) first, the rest after the first compositions
        leaders = {preset_of(s): s for s in reversed(paying)}.values()
        first = [s for s in plan.seeds if s in leaders or structural(s)]
        plan = PresetPlan(first, plan.skipped, [s for s in plan.seeds if s not in first])
    return plan


def preset_of(seed: SeedRecipe) -> str:
    """The preset a preset seed runs (``int8-static`` of ``preset-int8-static@openvino``)."""
    return seed.name.removeprefix(PRESET_PREFIX).rpartition("@")[0]


def structural(seed: SeedRecipe) -> bool:
    """Whether a preset changes the model's structure in float32 (``pack``): a building block that multiplies with
    the int8 that pays (MiniLM on a CPU: ``pack + int8d | compile``), so it is measured with the first presets."""
    return bool(seed.stages) and stage_precision(seed.stages) == "fp32"


def repeats(study: optuna.Study, seed: SeedRecipe) -> bool:
    """Whether a trial of ``study`` already carries ``seed``'s runtime and stages."""
    return any(t.user_attrs.get(ATTR_SEED_RECIPE) == seed.payload() for t in study.get_trials(deepcopy=False))


def costly(seed: SeedRecipe) -> bool:
    """Whether a seed holds a costly stage (one with a low-fidelity form: distillation, a long calibration)."""
    return any(config_from_dict(dict(raw)).low_fidelity() is not None for raw in seed.stages)


def initial_queue(plan: PresetPlan, seeds: Sequence[SeedRecipe]) -> tuple[list[SeedRecipe], list[SeedRecipe]]:
    """What a new study enqueues after its baseline, and what waits until its queue runs dry: without waiting
    presets, every preset then the config's ``seeds`` in order; with them (:attr:`PresetPlan.later`), the first
    presets and the cheap seeds now, the other presets and the :func:`costly` seeds later."""
    if not plan.later:
        return [*plan.seeds, *seeds], []
    return ([*plan.seeds, *(s for s in seeds if not costly(s))],
            [*plan.later, *(s for s in seeds if costly(s))])
