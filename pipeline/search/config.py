"""The search config (``pipeline/defaults/search.yaml`` + CLI overrides), the study's name, storage and sampler."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import optuna
import torch
import yaml
from optuna.trial import TrialState
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, ValidationError, field_validator

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.input_agreement import COSINE_FLOOR, TAIL_LIMIT, TailGuard, parse_tail_limit
from paretorch.pipeline.core.latency import LATENCY_BUDGETS
from paretorch.pipeline.core.names import WORKLOADS
from paretorch.pipeline.core.paths import DEFAULT_SEARCH_CONFIG, results_dir
from paretorch.pipeline.core.runtimes.registry import check_runtime_names
from paretorch.pipeline.core.stage import config_from_dict, format_validation_error
from paretorch.pipeline.engine.graph import Pipeline
from paretorch.pipeline.search.allowed_drop import DEFAULT_MAX_DROP, AllowedDrop
from paretorch.pipeline.search.objectives import ATTR_ESTIMATE, ObjectiveName

if TYPE_CHECKING:
    import optuna

    from paretorch.pipeline.core.spec import ModelSpec

class SeedRecipe(BaseModel):
    """A trial enqueued before the sampler starts: named stage configs and a runtime."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    runtime: str = "eager"
    stages: tuple[dict[str, Any], ...] = ()
    #: A seed some devices cannot run (e.g. CPU-only int8), or that the model's facts rule out (depth pruning of a
    #: model without a removable block), is skipped there; otherwise it is an infeasible or ruled-out trial that
    #: says why (what a user's own seed should be). Dumped only when set: a field added later leaves the names of
    #: studies whose seeds do not use it unchanged.
    skip_where_unavailable: bool = Field(default=False, exclude_if=lambda value: not value)
    #: What a proposal's estimate started from (:mod:`paretorch.pipeline.search.dead_ends`): ``{"speedup", "under"}``
    #: for a runtime sweep, ``{"gain"}`` for a composition; checked again when the trial starts. Dumped only when set.
    estimate: dict[str, Any] | None = Field(default=None, exclude_if=lambda value: value is None)

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, name: str) -> str:
        return known_runtime_names((name,))[0]

    def trial_attrs(self) -> dict[str, Any]:
        """User attrs the seed adds to its enqueued trial beyond its recipe: a proposal's estimate."""
        return {ATTR_ESTIMATE: self.estimate} if self.estimate else {}

    def payload(self) -> dict[str, Any]:
        """The seed's runtime and validated stage dicts, as its trial records them (two seeds that would run the
        same trial have the same payload)."""
        return {"runtime": self.runtime, "stages": [config_from_dict(dict(raw)).to_dict() for raw in self.stages]}


#: The runtimes value that means every runtime available on the device (the default: a newly installed
#: runtime joins the study instead of renaming it).
ALL_RUNTIMES = ("all",)


def known_runtime_names(names: tuple[str, ...] | str) -> tuple[str, ...]:
    """``names`` unchanged when every one is a registered runtime (a device may lack some: they are dropped
    later, by the capability table), or :data:`ALL_RUNTIMES`; an unknown name is a typo, a ValueError naming the
    registered ones (the registry words it)."""
    names = (names,) if isinstance(names, str) else tuple(names)
    if names == ALL_RUNTIMES:
        return names
    try:
        return check_runtime_names(names)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


class Preset(BaseModel):
    """A cheap stage list (no training, no long calibration) tried alone before the seeds
    (:mod:`paretorch.pipeline.search.presets`), under each of ``runtimes`` the study offers, in that order."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    stages: tuple[dict[str, Any], ...] = ()
    #: Where the preset can pay, in the order to try them (those the study does not offer are left out); None:
    #: every runtime of the study, eager last. E.g. PT2E int8 under eager runs reference kernels, slower than float.
    runtimes: tuple[str, ...] | None = None

    @field_validator("runtimes")
    @classmethod
    def _known_runtimes(cls, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if names is None else known_runtime_names(names)


#: ``max_drop``: ``0.01`` (absolute) or ``"1%"`` (of the baseline metric); a bad value raises the flag's ConfigError.
MaxDrop = Annotated[AllowedDrop, PlainValidator(AllowedDrop.parse), PlainSerializer(AllowedDrop.to_json)]
#: ``tail_limit``: a share of the inputs (``"1%"``, ``0.02``) or ``"off"`` (None).
TailLimit = Annotated[float | None, PlainValidator(parse_tail_limit),
                      PlainSerializer(lambda share: "off" if share is None else share)]


class SearchConfig(BaseModel):
    """What is searched and how (``pipeline/defaults/search.yaml``; CLI flags override fields)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    pipeline: str = "default"
    objectives: tuple[ObjectiveName, ...] = ("metric", "latency")
    max_drop: MaxDrop = DEFAULT_MAX_DROP
    sampler: Literal["tpe", "nsga2", "random"] = "tpe"
    seed: int = 0
    #: The runtimes searched, intersected with the device's; ``all`` (the default): every runtime available there.
    runtimes: tuple[str, ...] = ALL_RUNTIMES
    #: A name of :data:`paretorch.pipeline.core.latency.LATENCY_BUDGETS`: how long each trial is timed, alone and
    #: paired.
    latency_budget: str = "normal"
    latency_batch: int | None = Field(default=None, ge=1)
    disabled: tuple[str, ...] = ()
    exports: Literal["pareto", "every_trial", "none"] = "pareto"
    seeds: tuple[SeedRecipe, ...] = ()
    #: Cheap precision presets, each tried alone under its runtimes before the seeds
    #: (:mod:`paretorch.pipeline.search.presets`).
    presets: tuple[Preset, ...] = ()
    cache_mb: int = Field(default=2048, ge=0)
    #: Trials composed from measured winners at most (:mod:`paretorch.pipeline.search.compose`; 0: none).
    compose: int = Field(default=6, ge=0)
    #: The runtime sweep covers this many of the fastest feasible stage lists (:mod:`paretorch.pipeline.search.sweep`).
    sweep_top: int = Field(default=3, ge=1)
    #: Costly stages run at low fidelity first (:mod:`paretorch.pipeline.search.screening`).
    screening: bool = True
    #: Costly stages (distillation, calibration) may take at most this share of a run's wall time: past it, a
    #: costly trial stops at low fidelity (:mod:`paretorch.pipeline.search.screening`).
    costly_share: float = Field(default=0.25, gt=0.0, le=1.0)
    #: The tail guard (:mod:`paretorch.pipeline.core.input_agreement`): at most this share of the inputs may break
    #: (``1%``, ``0.02``; ``off``: no guard), an embedding input below ``tail_cosine`` to its unoptimized output.
    tail_limit: TailLimit = TAIL_LIMIT
    tail_cosine: float = Field(default=COSINE_FLOOR, gt=-1.0, le=1.0)
    #: How the model will be used, what its latency is timed on (:data:`paretorch.pipeline.core.workload.WORKLOADS`):
    #: ``serve`` (raw inputs to host outputs, batch by batch), ``corpus`` (a whole list, sorted by length) or ``model``
    #: (the model call alone on the device batch).
    workload: str = WORKLOADS[0]

    #: Fields that do not change what a trial measures (left out of the study's name): where results go,
    #: and which trials the search proposes besides its sampler's (a resumed study may change them).
    RUN_ONLY_FIELDS: ClassVar[frozenset[str]] = frozenset({"exports", "cache_mb", "compose", "sweep_top",
                                                            "screening", "presets", "costly_share"})

    @field_validator("runtimes", mode="before")
    @classmethod
    def _known_runtimes(cls, names: tuple[str, ...] | str) -> tuple[str, ...]:
        return known_runtime_names(names)

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, name: str) -> str:
        if name not in WORKLOADS:
            raise ValueError(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}")
        return name

    @field_validator("latency_budget")
    @classmethod
    def _known_budget(cls, name: str) -> str:
        if name not in LATENCY_BUDGETS:
            raise ValueError(f"unknown latency budget {name!r}: choose from {', '.join(LATENCY_BUDGETS)}")
        return name

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides: Any) -> SearchConfig:
        """Read a YAML search config (default ``pipeline/defaults/search.yaml``) and apply overrides (None = keep).
        Overriding ``seeds`` without ``presets`` turns the presets off: the given seeds are all that is enqueued."""

        source = Path(path) if path else DEFAULT_SEARCH_CONFIG
        data: dict[str, Any] = {}
        if source.is_file():
            try:
                data = yaml.safe_load(source.read_text()) or {}
            except yaml.YAMLError as exc:
                raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
        elif path:
            raise ConfigError(f"search config not found: {source}")
        given = {k: v for k, v in overrides.items() if v is not None}
        if "seeds" in given and "presets" not in given:
            given["presets"] = ()  # a caller that lists the seeds lists every trial enqueued before the sampler
        data.update(given)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            flags = sorted({cli_flag(str(e["loc"][0])) for e in exc.errors() if e["loc"] and e["loc"][0] in given})
            where = f"{', '.join(flags)}" if flags else f"invalid search config ({source.name})"
            raise ConfigError(f"{where}: {format_validation_error(exc)}") from exc

    #: Fields a study's name hashes only when set away from their defaults (added after studies were named by
    #: the others: a study begun before keeps its name under the defaults).
    LATER_FIELDS: ClassVar[frozenset[str]] = frozenset({"tail_limit", "tail_cosine"})

    def identity(self) -> dict[str, Any]:
        """What a study's name hashes: every field that changes what a trial measures."""
        later = {name for name in self.LATER_FIELDS if getattr(self, name) == type(self).model_fields[name].default}
        return self.model_dump(mode="json", exclude=set(self.RUN_ONLY_FIELDS) | later)

    def tail_guard(self) -> TailGuard:
        """The tail guard these fields set."""
        return TailGuard(self.tail_limit, self.tail_cosine)


def cli_flag(field_name: str) -> str:
    """The command-line flag that sets a search config field (``max_drop`` -> ``--max-drop``)."""
    return {"disabled": "--disable"}.get(field_name, "--" + field_name.replace("_", "-"))


def study_name(spec: ModelSpec, device: torch.device, config: SearchConfig, pipeline: Pipeline) -> str:
    """``<spec>-<device type>-<hash of spec source, search config and pipeline>``. The default pipeline is
    named by the search config alone (``pipeline: default``), not by its stage list: installing or adding a
    stage does not rename its studies (a resumed study records the stages it has,
    :mod:`paretorch.pipeline.search.study_names`). A pipeline file's nodes are hashed: they are what its trials mean."""
    payload: dict[str, Any] = {"spec": spec.source or spec.name, "search": config.identity()}
    if config.pipeline != "default":
        payload["pipeline"] = pipeline.to_dict()
    return _hashed(spec, device, payload)


def legacy_study_name(spec: ModelSpec, device: torch.device, config: SearchConfig, pipeline: Pipeline) -> str:
    """The name :func:`study_name` gave before it stopped hashing the default pipeline's stage list
    (the migration rule in :func:`paretorch.pipeline.search.study_names.find_study` looks for it)."""
    return _hashed(spec, device, {"spec": spec.source or spec.name, "pipeline": pipeline.to_dict(),
                                  "search": config.identity()})


#: The default ``runtimes`` before it became ``all`` (every runtime available): a default study named then is
#: found under the name this list gave it (:func:`legacy_study_names`).
LEGACY_DEFAULT_RUNTIMES = ("eager", "compile", "compile_dynamic", "compile_cudagraphs", "onnxruntime", "openvino")


def legacy_study_names(spec: ModelSpec, device: torch.device, config: SearchConfig, pipeline: Pipeline
                       ) -> tuple[str, ...]:
    """The names earlier rules gave the study, newest first: the stage list hashed (:func:`legacy_study_name`),
    and for the default ``runtimes: all`` the names of the runtime list that was the default before."""
    names = [legacy_study_name(spec, device, config, pipeline)]
    if config.runtimes == ALL_RUNTIMES:
        listed = config.model_copy(update={"runtimes": LEGACY_DEFAULT_RUNTIMES})
        names += [study_name(spec, device, listed, pipeline), legacy_study_name(spec, device, listed, pipeline)]
    return tuple(names)


def _hashed(spec: ModelSpec, device: torch.device, payload: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{spec.name}-{device.type}-{digest}"


def default_storage() -> str:
    """``sqlite:///<results>/optuna.db``."""
    return f"sqlite:///{results_dir() / 'optuna.db'}"


def finished_states() -> tuple[Any, ...]:
    return (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


#: Sampler seeds of two workers are this far apart (workers of one study never share a seed).
WORKER_SEED_STRIDE = 100_003


def make_sampler(config: SearchConfig, finished: int, worker: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler; its seed moves with the number of finished trials so a resumed
    study does not replay the first run's random start-up trials, and with the worker's
    index so that workers of one study do not sample the same configs."""
    seed = config.seed + finished + worker * WORKER_SEED_STRIDE
    if config.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if config.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # multivariate + group: a joint model per set of co-occurring params (stages switch on and off).
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=8,
                                           constant_liar=True)  # running trials (other workers) count as seen


