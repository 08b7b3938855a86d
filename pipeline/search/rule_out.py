"""Rule out before running: a configuration that cannot change this model is not a trial.

Once per study, each stage of the pipeline reads its cheap facts about the unoptimized model
(``Stage.facts``: the layers quantization could touch, the blocks depth pruning could remove;
a TorchScript model is known as such): :class:`RuleOut`. Before any node of a trial's chain
runs (so before a costly prefix such as prune + distill), every stage config of the chain is
checked: the capability table must not call it slower only (``Stage.worthwhile``), and its
stage must not rule it out against the facts (``Stage.rules_out``), and the trial's runtime must be
able to run the chain (:meth:`paretorch.pipeline.core.runtimes.base.Runtime.cannot_run`: no torch.compile of a
TorchScript model, no ONNX Runtime for numerics it does not reproduce, such as AMP; the runtime
sweep does not propose such pairs either). A ruled-out trial ends
pruned at once, with its reason in :data:`ATTR_RULED_OUT`; it does not count toward the
study's trials (:class:`paretorch.pipeline.search.duplicates.TrialBudget`) and gets no MLflow run.
A config the device cannot run (``Stage.requires``) stays what it was, an infeasible trial with
its reason (:meth:`RuleOut.unavailable`), but it too ends before any stage of the chain runs.

It is never sampled again (a stage list and runtime that cannot go together can be: the sampler
picks the runtime apart from the stages; each such pair is ruled out again, not counted): each
stage's ``suggest`` offers only the choices the facts leave
(:meth:`paretorch.pipeline.core.stage.StageContext.offered`), a per-model list, stable within a study
(Optuna cannot change a categorical's choices within a study: a study that fixed a param's
choices before keeps them, :func:`study_choices`, and its ruled-out choices are answered here).
The search skips ruled-out seeds, and the study's count and reasons are stored and printed at
the end (:func:`summarize`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import optuna
import torch
from optuna.distributions import CategoricalChoiceType, CategoricalDistribution
from optuna.trial import FrozenTrial
from torch import nn

from paretorch.pipeline.core.device import Capabilities, capabilities, move_module
from paretorch.pipeline.core.model_facts import ModelFacts, is_scripted
from paretorch.pipeline.core.runtimes.registry import get_runtime
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, export_mirror, stage_for

#: Trial user attr: why the trial's configuration cannot change the model (it was not run).
ATTR_RULED_OUT = "paretorch.ruled_out"
#: Study user attr: {reason: how many trials it ruled out}, written when a search ends.
ATTR_RULED_OUT_COUNTS = "paretorch.ruled_out_counts"
#: How much of a reason the end-of-search line shows.
NOTE_REASON_CHARS = 240


@dataclass(frozen=True)
class RuleOut:
    """The facts of one study's model and the device's capabilities: what they rule out."""

    facts: ModelFacts
    caps: Capabilities

    @classmethod
    def read(cls, model: nn.Module, spec: ModelSpec, device: torch.device, stages: Iterable[Stage]) -> RuleOut:
        """Read ``stages``' facts about the unoptimized ``model`` (on ``device``; not changed). A
        TorchScript model has no stage facts (stages rule out what they cannot do to one from
        ``ModelFacts.scripted``); a stage whose facts fail to read is listed with why in ``unknown``."""
        scripted = is_scripted(model)
        ctx = StageContext(spec=spec, device=device)
        model = move_module(model, device).eval()
        found: dict[str, object] = {}
        unknown: dict[str, str] = {}
        for stage in {s.name: s for s in stages}.values():
            if stage.facts is None or scripted:
                continue
            try:
                found[stage.name] = stage.facts(model, ctx)
            except Exception as exc:  # a model the probe cannot read: nothing ruled out for it, said once
                unknown[stage.name] = f"{type(exc).__name__}: {exc}"
        return cls(ModelFacts(scripted=scripted, stages=found, unknown=unknown), capabilities(device))

    def reason(self, configs: Iterable[StageConfig | None]) -> str | None:
        """Why the chain of ``configs`` (model stages in order; None = off) cannot change this model, naming
        the first stage that rules itself out, alone or after the stages before it; None: run it. Export configs
        are not checked (they run later)."""
        upstream: list[StageConfig] = []
        for config in configs:
            if config is None:
                continue
            stage = stage_for(config)
            if stage.is_export:
                continue
            why = (stage.not_worthwhile(config, self.caps) or stage.ruled_out(config, self.facts)
                   or stage.cannot_follow(config, upstream))
            if why is not None:
                return f"{stage.name}: {why}"
            upstream.append(config)
        return None

    def runtime_reason(self, configs: Iterable[StageConfig | None], runtime: str) -> str | None:
        """Why ``runtime`` cannot run the chain of ``configs`` on this model (a compiled runtime on
        TorchScript; ONNX Runtime on numerics it does not reproduce, such as AMP); None: it can."""
        mirror = export_mirror([c for c in configs if c is not None])
        return get_runtime(runtime).cannot_run(mirror, self.facts.scripted)

    def unavailable(self, configs: Iterable[StageConfig | None]) -> str | None:
        """Why the device cannot run the chain of ``configs`` (``Stage.requires`` of the first stage that
        says so, as the runner words it); None: it can. Checked before the chain runs: an infeasible trial."""
        for config in configs:
            if config is not None and (why := stage_for(config).unavailable(config, self.caps)) is not None:
                return f"{config.stage}: {why}"
        return None

    def unknown_line(self) -> str | None:
        """The console line for stages whose facts could not be read (None when all were)."""
        if not self.facts.unknown:
            return None
        parts = "; ".join(f"{name}: {why}" for name, why in self.facts.unknown.items())
        return f"model facts not read (nothing ruled out for these stages): {parts}"


def study_choices(trials: Sequence[FrozenTrial]) -> dict[str, tuple[CategoricalChoiceType, ...]]:
    """The choices each categorical param already has in the study (the first trial that has it)."""
    choices: dict[str, tuple[CategoricalChoiceType, ...]] = {}
    for trial in trials:
        for name, distribution in trial.distributions.items():
            if isinstance(distribution, CategoricalDistribution) and name not in choices:
                choices[name] = tuple(distribution.choices)
    return choices


def is_ruled_out(trial: FrozenTrial) -> bool:
    """True for a trial whose configuration was ruled out before running (not a trial: not counted)."""
    return trial.user_attrs.get(ATTR_RULED_OUT) is not None


def ruled_out_counts(trials: Sequence[FrozenTrial]) -> Counter[str]:
    """{reason: trials it ruled out}."""
    return Counter(str(t.user_attrs[ATTR_RULED_OUT]) for t in trials if is_ruled_out(t))


def summarize(study: optuna.Study) -> str | None:
    """Store the study's ruled-out counts (:data:`ATTR_RULED_OUT_COUNTS`) and return the end-of-search note:
    a line with the total, then one line per distinct reason with its count, most frequent first (None when
    nothing was ruled out)."""
    counts = ruled_out_counts(study.get_trials(deepcopy=False))
    if not counts:
        return None
    if study.user_attrs.get(ATTR_RULED_OUT_COUNTS) != dict(counts):
        study.set_user_attr(ATTR_RULED_OUT_COUNTS, dict(counts))
    reasons = "".join(f"\n  {count} x {_short(reason)}" for reason, count in counts.most_common())
    return (f"{sum(counts.values())} configuration(s) ruled out before running, as they cannot change this model "
            f"(not trials, not counted; Optuna attr '{ATTR_RULED_OUT}'), one line per reason:{reasons}")


def _short(reason: str) -> str:
    return reason if len(reason) <= NOTE_REASON_CHARS else reason[: NOTE_REASON_CHARS - 3] + "..."
