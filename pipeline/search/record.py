"""One typed record per trial: built once, then written to Optuna and to MLflow.

The objective builds a :class:`TrialRecord` when a trial ends (complete, infeasible or
failed); its :meth:`~TrialRecord.user_attrs` are the trial's Optuna user attributes, and
the tracker's child run is written from the same record in one call (params = the
*resolved* recipe, metrics, tags). A trial that an earlier process ran is read back with
:meth:`TrialRecord.from_trial`.

What a trial's stages recorded goes into its record too. **Budgets**: quantization's float fallback and AMP's
calibration keep layers in float to hold an *output-error* budget, a proxy for ranking layers; a trial's verdict is
always the task metric (:meth:`paretorch.pipeline.search.objectives.Objectives.verdict`). Logging both per trial
(:func:`budget_metrics`) shows a budget that is stricter than the task needs: layers kept in float while the task
metric still has headroom under the allowed drop (a looser budget, or none, may be accepted). **Sensitivity tables**:
AMP calibration records ``amp.sensitivity`` ({layer: output error with that layer alone in the reduced dtype}) and
``amp.pinned`` ({layer: why it stays float32}); the resolved config names the layers kept in float32.
:func:`sensitivity_tables` turns them into one CSV per node, logged as an artifact of the trial's run (which layers
cost accuracy, which stayed in float).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from optuna.trial import FrozenTrial

from paretorch.pipeline.core.stage import StageConfig
from paretorch.pipeline.core.text import plain
from paretorch.pipeline.engine.recipe import OFF, Recipe, configs_from_json, configs_to_json, flatten_node_configs
from paretorch.pipeline.engine.short_recipe import short_recipe
from paretorch.pipeline.search.objectives import (
    ATTR_CACHE,
    ATTR_CONFIGS,
    ATTR_FEASIBLE,
    ATTR_INFEASIBLE,
    ATTR_LATENCY_UNSTABLE,
    ATTR_METRICS,
    ATTR_REASON,
    ATTR_RECIPE,
    ATTR_RECIPE_LINE,
    ATTR_REPEAT_OF,
    ATTR_RUNTIME,
    ATTR_SECONDS,
    ATTR_SEED,
    ATTR_TRACEBACK,
    ATTR_UNCERTAIN,
    FLOOR_REASON,
    TAIL_REASON,
    TRACEBACK_CHARS,
    DropVerdict,
)
from paretorch.pipeline.search.probe import BEHIND_FRONT
from paretorch.pipeline.search.rule_out import ATTR_RULED_OUT
from paretorch.pipeline.search.screening import SCREENED_OUT
from paretorch.pipeline.tracking.views import namespace_metrics

if TYPE_CHECKING:
    from paretorch.pipeline.engine.run_result import NodeResult

COMPLETE, PRUNED, FAIL = "COMPLETE", "PRUNED", "FAIL"
#: How the reason of a trial within the drop that a guard rules out starts (a fidelity floor, the tail guard).
GUARD_REASONS = (FLOOR_REASON, TAIL_REASON)
#: What decided a trial (its line says it): the latency probe alone (not scored), a subset of the evaluation
#: data, or the full evaluation.
PROBE_FIDELITY, FULL_FIDELITY = "latency probe", "full evaluation"
ATTR_FIDELITY = "paretorch.fidelity"
#: The trial's worst inputs against the unoptimized model (a list of ``{index, cosine | flip | abs_error, broken,
#: text}``), and the file that holds them in its MLflow run and its front folder.
ATTR_WORST_INPUTS = "paretorch.worst_inputs"
WORST_INPUTS_FILE = "worst_inputs.json"
#: What AMP calibration records: each layer's output error alone in the reduced dtype, and why a layer stays float32.
SENSITIVITY_RECORD = "amp.sensitivity"
PINNED_RECORD = "amp.pinned"


def worst_inputs_text(rows: Collection[Mapping[str, Any]]) -> str:
    """:data:`WORST_INPUTS_FILE`'s text: the rows, worst first, one JSON list."""
    return json.dumps(list(rows), indent=1, ensure_ascii=False) + "\n"
#: The MLflow param beside a resolved one that keeps what the trial asked for (``export.onnx.fusions.requested``).
REQUESTED_SUFFIX = ".requested"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def failure_line(traceback_text: str) -> str:
    """The exception line of a traceback (``RuntimeError: ...``), not the notes added after it."""
    lines = traceback_text.strip().splitlines() or ["?"]
    return next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line)), lines[-1])


@dataclass(frozen=True)
class TrialRecord:
    """What one trial asked for, what it resolved to and what it measured."""

    number: int
    state: str
    runtime: str
    #: Per stage node: the config the trial asked for (None = off).
    configs: dict[str, StageConfig | None] = field(default_factory=dict)
    #: The resolved, replayable recipe (complete trials).
    recipe: Recipe | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=dict)
    seed: str | None = None
    infeasible: str | None = None
    error: str | None = None
    start_ms: int | None = None
    #: The earlier trial that measured the same recipe (this trial was not run).
    repeat_of: int | None = None
    #: Why the configuration cannot change the model (this trial was not run:
    #: :mod:`paretorch.pipeline.search.rule_out`).
    ruled_out: str | None = None
    #: Complete and within the allowed drop (None: not known, e.g. a record without the drop).
    feasible: bool | None = None
    #: Why a complete trial is not feasible (e.g. ``drop 0.034 > allowed 0.01``).
    over_drop: str | None = None
    #: ``latency unstable: ...``: a complete trial whose paired latency stayed too noisy to trust (off the front).
    latency_unstable: str | None = None
    #: The metric drop's bootstrap interval straddles the allowed drop: feasible or not, within sampling noise.
    uncertain: bool = False
    #: Text artifacts of the trial's run built in this process (e.g. AMP sensitivity CSVs).
    tables: dict[str, str] = field(default_factory=dict)
    #: What decided it: :data:`PROBE_FIDELITY`, a subset (``subset 256 of 1797 rows``) or :data:`FULL_FIDELITY`.
    fidelity: str | None = None
    #: The inputs that agree least with the unoptimized model, worst first
    #: (:mod:`paretorch.pipeline.core.input_agreement`).
    worst_inputs: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        # Reasons and tracebacks quote third-party messages (a compiler's coloured error): stored and printed plain.
        for name in ("infeasible", "error", "over_drop", "latency_unstable", "ruled_out"):
            text = getattr(self, name)
            if text is not None:
                object.__setattr__(self, name, plain(text))

    @property
    def counted(self) -> bool:
        """False for a trial that was not run (a repeat, a ruled-out configuration): not one of the study's trials."""
        return self.repeat_of is None and self.ruled_out is None

    # ------------------------------------------------------------------ Optuna

    def user_attrs(self) -> dict[str, Any]:
        """The trial's Optuna user attributes (the seed's are set when it is enqueued)."""
        attrs: dict[str, Any] = {ATTR_CONFIGS: configs_to_json(self.configs), ATTR_RUNTIME: self.runtime}
        if self.recipe is not None:
            attrs[ATTR_RECIPE] = self.recipe.to_dict()
            attrs[ATTR_RECIPE_LINE] = self.recipe.describe()
        if self.metrics:
            attrs[ATTR_METRICS] = dict(self.metrics)
        if self.seconds:
            attrs[ATTR_SECONDS] = dict(self.seconds)
        if self.cache:
            attrs[ATTR_CACHE] = dict(self.cache)
        if self.infeasible is not None:
            attrs[ATTR_INFEASIBLE] = self.infeasible
        if self.error is not None:
            attrs[ATTR_TRACEBACK] = self.error[-TRACEBACK_CHARS:]
        if self.repeat_of is not None:
            attrs[ATTR_REPEAT_OF] = self.repeat_of
        if self.ruled_out is not None:
            attrs[ATTR_RULED_OUT] = self.ruled_out
        if self.latency_unstable is not None:
            attrs[ATTR_LATENCY_UNSTABLE] = self.latency_unstable
        if self.uncertain:
            attrs[ATTR_UNCERTAIN] = True
        if self.fidelity is not None:
            attrs[ATTR_FIDELITY] = self.fidelity
        if self.worst_inputs:
            attrs[ATTR_WORST_INPUTS] = list(self.worst_inputs)
        attrs[ATTR_FEASIBLE] = bool(self.feasible)
        reason = self.reason()
        if reason is not None:
            attrs[ATTR_REASON] = reason
        return attrs

    def reason(self) -> str | None:
        """Why this trial is not a feasible result (None when it is one)."""
        if self.repeat_of is not None:
            return f"repeat of trial {self.repeat_of}"
        if self.ruled_out is not None:
            return f"ruled out: {self.ruled_out}"
        if self.infeasible is not None:  # a screened-out trial is not infeasible: its screen said it cannot win
            stopped = self.infeasible.startswith((SCREENED_OUT, BEHIND_FRONT))
            return self.infeasible if stopped else f"infeasible: {self.infeasible}"
        if self.state == FAIL:
            return f"failed: {failure_line(self.error or '?')[:300]}"
        if self.over_drop is not None:
            return self.over_drop if self.over_drop.startswith(GUARD_REASONS) else (
                f"over the allowed drop: {self.over_drop}")
        return self.latency_unstable

    def outcome(self) -> str:
        """How the trial ended, in words (MLflow's ``outcome`` tag): ``complete``, ``stopped: <why>`` for a pruned
        trial (``stopped: by the latency probe: ...``, ``stopped: screened out ...``, a repeat, a configuration
        that cannot run here: never a verdict on the allowed drop), ``failed: <the exception line>``."""
        if self.state == COMPLETE:
            return "complete"
        if self.state == PRUNED:
            why = self.infeasible or self.reason() or "?"
            return f"stopped: {why.removeprefix('stopped ')}"
        return self.reason() or "failed"

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> TrialRecord:
        """The record of a finished trial read back from storage (e.g. run by an earlier process)."""
        attrs = trial.user_attrs
        recipe = Recipe.from_dict(attrs[ATTR_RECIPE]) if ATTR_RECIPE in attrs else None
        error = attrs.get(ATTR_TRACEBACK) or trial.system_attrs.get("fail_reason")
        return cls(
            number=trial.number,
            state=trial.state.name,
            runtime=str(attrs.get(ATTR_RUNTIME, recipe.runtime if recipe else "?")),
            configs=configs_from_json(attrs.get(ATTR_CONFIGS, {})),
            recipe=recipe,
            metrics=dict(attrs.get(ATTR_METRICS, {})),
            seconds=dict(attrs.get(ATTR_SECONDS, {})),
            cache=dict(attrs.get(ATTR_CACHE, {})),
            seed=attrs.get(ATTR_SEED),
            infeasible=attrs.get(ATTR_INFEASIBLE),
            error=str(error) if error and trial.state.name == FAIL else None,
            start_ms=int(trial.datetime_start.timestamp() * 1000) if trial.datetime_start else None,
            repeat_of=attrs.get(ATTR_REPEAT_OF),
            ruled_out=attrs.get(ATTR_RULED_OUT),
            feasible=attrs.get(ATTR_FEASIBLE),
            over_drop=_over_drop(attrs.get(ATTR_REASON)),
            latency_unstable=attrs.get(ATTR_LATENCY_UNSTABLE),
            uncertain=bool(attrs.get(ATTR_UNCERTAIN, False)),
            fidelity=attrs.get(ATTR_FIDELITY),
            worst_inputs=tuple(attrs.get(ATTR_WORST_INPUTS, ())),
        )

    # ------------------------------------------------------------------ MLflow

    def params(self) -> dict[str, str]:
        """Flat params: the resolved recipe where the trial completed (e.g. the calibrated AMP
        dtype and float32 layers, the ONNX fusions applied, OpenVINO's inference precision), the
        requested configs otherwise; stages that were off say so. A setting that resolved to something
        else than was asked (``auto``) keeps the request beside it, as ``<param>.requested``."""
        requested = flatten_node_configs(self.configs, self.runtime)
        if self.recipe is None:
            return requested
        resolved = {k: v for k, v in requested.items() if v == OFF}
        resolved.update(self.recipe.flat_params())
        resolved.update({f"{k}{REQUESTED_SUFFIX}": v for k, v in requested.items()
                         if k in resolved and resolved[k] != v})
        return resolved

    def tracking_metrics(self, headline: Collection[str] | None = None) -> dict[str, float]:
        """The metrics of the child run; with ``headline``, every other one under ``detail.``."""
        metrics = dict(self.metrics)
        metrics.update({f"seconds_{k}": v for k, v in self.seconds.items()})
        metrics.update({f"cache_{k}": float(v) for k, v in self.cache.items()})
        return metrics if headline is None else namespace_metrics(metrics, headline)

    def run_name(self) -> str:
        """The MLflow run's name: the trial number and its short recipe (``016 prune 0.3 + int8s | ort``), the one the
        console prints; the configs it asked for where it did not complete."""
        if self.recipe is not None:
            stages: list[StageConfig | None] = list(self.recipe.stages)
        else:
            stages = list(self.configs.values())
        return f"{self.number:03d} {short_recipe(stages, self.recipe.runtime if self.recipe else self.runtime)}"

    def tracking_tags(self, common: Mapping[str, str], exports_ran: bool = False) -> dict[str, str]:
        """The run's tags; its ``recipe`` names the exports only where they ran with the trial (``exports_ran``):
        the Pareto trials' exports, at the end of the search, set it again with those that ran."""
        tags = {**common, "pareto": "false", "optuna.trial_number": str(self.number)}
        if self.seed is not None:
            tags["seed"] = self.seed
        if self.recipe is not None:
            tags["recipe"] = self.recipe.describe(exports=exports_ran)
        if self.infeasible is not None:
            tags["infeasible_reason"] = self.infeasible
        if self.state != PRUNED:  # a stopped trial was never judged against the allowed drop
            tags["feasible"] = str(bool(self.feasible)).lower()
        tags["outcome"] = self.outcome()
        reason = self.reason()
        if reason is not None:
            tags["reason"] = reason
        if self.latency_unstable is not None:
            tags["latency_unstable"] = self.latency_unstable[:500]
        if self.uncertain:
            tags["uncertain"] = "true"
        if self.fidelity is not None:
            tags["decided_by"] = self.fidelity
        if self.repeat_of is not None:
            tags["repeat_of"] = str(self.repeat_of)
        if self.error:
            tags["error"] = failure_line(self.error)[:500]
        return tags

    def texts(self) -> dict[str, str]:
        texts = dict(self.tables)
        if self.worst_inputs:
            texts[WORST_INPUTS_FILE] = worst_inputs_text(self.worst_inputs)
        if self.state == FAIL and self.error:
            texts["traceback.txt"] = self.error
        return texts

    # ------------------------------------------------------------------ search bookkeeping

    @property
    def stages_key(self) -> str | None:
        """The resolved model stages as one comparable string (runtime and exports left out)."""
        if self.recipe is None:
            return None
        return json.dumps([c.to_dict() for c in self.recipe.model_stages()], sort_keys=True, default=str)


@dataclass(frozen=True)
class TrialOutcome:
    """What the trial objective hands back to the trial loop: the trial's record, and what Optuna is told."""

    record: TrialRecord
    #: The objective values of a complete trial (None otherwise).
    values: tuple[float, ...] | None = None
    #: The exception a failed trial raised (Optuna marks the trial FAIL).
    failure: Exception | None = None
    #: A complete trial's metric against the allowed drop (its Optuna constraint).
    verdict: DropVerdict | None = None


def _over_drop(reason: str | None) -> str | None:
    prefix = "over the allowed drop: "
    if reason and reason.startswith(GUARD_REASONS):
        return reason
    return reason.removeprefix(prefix) if reason and reason.startswith(prefix) else None


def budget_metrics(stages: Iterable[StageConfig], headroom: float) -> dict[str, float]:
    """Per budget held: its value and the layers kept in float for it; with any, the task metric's
    headroom (allowed drop minus drop; > 0: the task metric would have allowed more)."""
    metrics: dict[str, float] = {}
    for config in stages:
        use = config.budget_use()
        if use is None:
            continue
        metrics[use.name] = use.budget
        metrics[f"{use.name}_float_layers"] = float(use.float_layers)
    if metrics:
        metrics["drop_headroom"] = headroom
    return metrics


def sensitivity_csv(sensitivity: Mapping[str, float], kept_float: set[str], pinned: Mapping[str, str]) -> str:
    """``layer,error_alone_reduced,kept_float32,why`` rows, costliest layer first."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["layer", "error_alone_reduced", "kept_float32", "why"])
    for layer, error in sorted(sensitivity.items(), key=lambda item: -float(item[1])):
        writer.writerow([layer, f"{float(error):.4g}", str(layer in kept_float).lower(), pinned.get(layer, "")])
    return out.getvalue()


def sensitivity_tables(nodes: Mapping[str, NodeResult]) -> dict[str, str]:
    """``{"<node>_sensitivity.csv": csv}`` for each node of a run that recorded a calibration."""
    tables: dict[str, str] = {}
    for name, node in nodes.items():
        records = node.records
        if SENSITIVITY_RECORD not in records:
            continue
        kept = set(getattr(node.resolved, "fp32_layers", None) or ())
        tables[f"{name.replace('#', '_')}_sensitivity.csv"] = sensitivity_csv(
            records[SENSITIVITY_RECORD], kept, records.get(PINNED_RECORD) or {})
    return tables
