"""The stage API: what a stage is, what it may read, and the one registry of stages.

A stage is one :class:`Stage` record built in the stage's own module: a frozen,
validated config class (with its search space, ``suggest``) plus one pure function
``apply(model, config, ctx)``, how exports mirror it, what it needs from the
device and where it sits in the default pipeline. Transform stages return a new
model; export stages return an :class:`ExportResult`. :func:`apply_stage` hands the
function a deep copy, so a stage can never change its caller's model.

The record is typed by its config: ``Stage(QuantizeConfig, apply, mirror=mirror, ...)`` is a
``Stage[QuantizeConfig]``, and the type checker holds ``apply``, ``mirror``, ``requires``,
``worthwhile`` and ``rules_out`` to take a ``QuantizeConfig``. The registry is keyed by config
type (like torchao's config-keyed ``quantize_`` handlers): :func:`stage_for` finds a config's stage
from its class, and every call through the record (:meth:`Stage.run`, :meth:`Stage.mirror_of`, ...)
checks that the config is the stage's own before the stage's function sees it.

Stages are found through the ``paretorch.stages`` entry-point group
(:data:`ENTRY_POINT_GROUP`): the built-ins declare theirs in ``pyproject.toml``, a
separately installed package does the same. Nothing in ``pipeline`` imports a stage.
The config and context classes live in :mod:`paretorch.pipeline.core.stage_config` and
:mod:`paretorch.pipeline.core.stage_context`; this module is where stages import the whole API from.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast

import torch
from pydantic import ValidationError
from torch import nn

from paretorch.pipeline.core.device import Capabilities
from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig
from paretorch.pipeline.core.mirror import ExportMirror, NotMirrored
from paretorch.pipeline.core.model_facts import ModelFacts
from paretorch.pipeline.core.plugins import load_group
from paretorch.pipeline.core.stage_config import BudgetUse, ExportConfig, StageConfig, format_validation_error
from paretorch.pipeline.core.stage_context import ExportResult, StageContext

__all__ = [
    "ENTRY_POINT_GROUP",
    "BudgetUse",
    "ExportConfig",
    "ExportResult",
    "Stage",
    "StageConfig",
    "StageContext",
    "apply",
    "apply_stage",
    "config_from_dict",
    "default_order",
    "export_mirror",
    "format_validation_error",
    "get_stage",
    "is_export",
    "load_entry_points",
    "register_stage",
    "registered",
    "registered_stages",
    "stage_for",
    "transform",
    "unregister_stage",
]

C = TypeVar("C", bound=StageConfig)
#: A stage's config type, as the record holds it: a ``Stage[QuantizeConfig]`` is a ``Stage[StageConfig]``
#: (the registry's view), safe because the record's methods take any config and check it is the stage's own.
C_co = TypeVar("C_co", bound=StageConfig, covariant=True)

#: What a stage's ``apply`` returns: the new model, or for an export stage what it wrote.
StageOutput = nn.Module | ExportResult
#: ``apply(model, config, ctx)``: the pure function of a stage.
ApplyFn = Callable[[nn.Module, C, StageContext], StageOutput]
#: How exports reproduce a config: its mirror facts.
MirrorFn = Callable[[C], ExportMirror]
#: What a config needs from the device: a reason it cannot run there, or None.
RequiresFn = Callable[[C, Capabilities], str | None]
#: Cheap facts a stage reads about the unoptimized model (once per study), e.g. its removable blocks.
FactsFn = Callable[[nn.Module, StageContext], object]
#: Why a config cannot change the model these facts describe, or None.
RulesOutFn = Callable[[C, ModelFacts], str | None]
#: Why a config cannot apply to the model its upstream stages' configs made (in pipeline order), or None.
AfterFn = Callable[[C, Sequence[StageConfig]], str | None]
#: ``(model, device, runtime) -> callable``: what a deployment calls, built from a recipe's final model.
DeployFn = Callable[[nn.Module, torch.device, str], Callable[..., Any]]
#: The matmul precision a config runs in (``int8``, ``bf16``, ``fp16``: the ones the machine probe times; another
#: name, e.g. ``int4``, for a reduced precision it does not time), or None: float32, or not known before it runs.
PrecisionFn = Callable[[C], str | None]
#: A config in the short recipe notation (``prune 0.3``, ``int8s``, ``bf16 (12 fp32)``).
ShortFn = Callable[[C], str]


@dataclass(frozen=True)
class Stage(Generic[C_co]):
    """One stage, everything about it in one record (built in the stage's own module).

    * ``config_type`` and ``apply``: the frozen config (with its ``suggest``) and the
      pure function; ``apply(model, config, ctx)`` returns a model, or an
      :class:`ExportResult` when ``produces="export"``.
    * ``numeric``: the stage changes numerics (quantize, amp), not the float graph;
      Core ML / ONNX convert the model before it and must mirror it.
    * ``mirror``: how exports reproduce it (see :mod:`paretorch.pipeline.core.mirror`): a function
      ``config -> ExportMirror``, :class:`NotMirrored` with the reason, or None for a
      stage whose effect is in the float graph the exports convert. A numeric stage
      must declare one of the first two.
    * ``requires``: ``(config, capabilities) -> reason | None``: what it needs from the
      device; a reason makes the config infeasible before any work is done.
    * ``order``: where it sits in the default pipeline (model stages ascending, exports
      after the last model stage); None: not in the default pipeline.
    * ``worthwhile``: ``(config, capabilities) -> reason | None``: why a config that *runs*
      on the device is not worth a trial there (the capability table says it can only be
      slower, e.g. a reduced dtype without fast kernels); the search skips such seeds.
    * ``facts``: ``(model, ctx) -> facts``: cheap facts about the unoptimized model this stage
      reads once per study (a Python model only; see :mod:`paretorch.pipeline.core.model_facts`).
    * ``rules_out``: ``(config, ModelFacts) -> reason | None``: why ``config`` cannot change this
      model (no layer it touches, no block it removes, a TorchScript model it cannot act on);
      a search checks every stage of a trial's chain before any of them runs, and such a
      configuration is not a trial. ``suggest`` reads it through :meth:`StageContext.offered`.
    * ``precision``: ``config -> "int8" | "bf16" | "fp16" | other | None``: the precision of the matrix products a
      config runs (quantize, amp; None: float32), what the machine probe judges a chain by
      (:func:`paretorch.pipeline.core.machine_probe.stage_precision`). A stage that declares one lowers the
      precision of the matrix products: two such stages speed up the same work, so their gains do not multiply
      (the search's composition reads :attr:`lowers_precision`).
    * ``short``: ``config -> str``: the config in the short recipe notation (``prune 0.3``, ``int8s``); None: its
      name and the values of its required fields (:mod:`paretorch.pipeline.engine.short_recipe`).
    * ``libraries``: the distributions whose versions change what the stage produces (torchao for quantize): a
      node of the stage is cache-keyed on them (torch always; :mod:`paretorch.pipeline.engine.cache`).
    * ``traceable``: ``torch.export`` can trace the model the stage returns (pack: no, its forward gathers
      the real tokens by data-dependent indices).
    * ``after``: ``(config, upstream configs) -> reason | None``: why ``config`` cannot apply to the model
      the stages before it made (static PT2E int8 needs a traceable model; AMP cannot run over a PT2E
      graph); checked with ``rules_out``, before the chain runs.
    * ``deploy``: ``(model, device, runtime) -> callable``: the callable a deployment runs from the final model
      of a recipe holding this stage, with its own input contract (pack:
      :class:`paretorch.stages.pack.deploy.PackedEncoder`, token id lists in). ``apply`` writes the files it is rebuilt
      from (:mod:`paretorch.pipeline.engine.deployment`).

    Call the functions through the methods (:meth:`run`, :meth:`mirror_of`, :meth:`unavailable`,
    :meth:`not_worthwhile`, :meth:`ruled_out`): they check the config is this stage's own.
    """

    config_type: type[C_co]
    apply: ApplyFn[C_co]
    produces: Literal["model", "export"] = "model"
    numeric: bool = False
    mirror: MirrorFn[C_co] | NotMirrored | None = None
    requires: RequiresFn[C_co] | None = None
    order: int | None = None
    worthwhile: RequiresFn[C_co] | None = None
    facts: FactsFn | None = None
    rules_out: RulesOutFn[C_co] | None = None
    precision: PrecisionFn[C_co] | None = None
    traceable: bool = True
    after: AfterFn[C_co] | None = None
    deploy: DeployFn | None = None
    short: ShortFn[C_co] | None = None
    libraries: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.config_type.stage:
            raise TypeError(f"{self.config_type.__name__} must set the class variable 'stage'")
        if self.numeric and self.mirror is None:
            raise TypeError(
                f"stage '{self.name}' is numeric: declare how exports mirror it "
                "(mirror=<config -> ExportMirror> or mirror=NotMirrored('why'))"
            )
        if self.produces == "export" and (self.numeric or self.mirror is not None):
            raise TypeError(f"export stage '{self.name}' cannot be numeric or mirrored")

    @property
    def name(self) -> str:
        return self.config_type.stage

    @property
    def is_export(self) -> bool:
        return self.produces == "export"

    @property
    def lowers_precision(self) -> bool:
        """Whether the stage declares the precision of its matrix products (quantize, amp)."""
        return self.precision is not None

    def own(self, config: StageConfig) -> C_co:
        """``config``, checked to be this stage's config type (a TypeError names both otherwise)."""
        if not isinstance(config, self.config_type):
            raise TypeError(f"{type(config).__name__} is not the config type of stage '{self.name}'")
        return config

    def run(self, model: nn.Module, config: StageConfig, ctx: StageContext) -> StageOutput:
        """``apply`` on ``model`` itself (:func:`apply_stage` hands it a copy)."""
        return self.apply(model, self.own(config), ctx)

    def unavailable(self, config: StageConfig, caps: Capabilities) -> str | None:
        """Why ``config`` cannot run on a device with ``caps`` (None: it can)."""
        return self.requires(self.own(config), caps) if self.requires is not None else None

    def not_worthwhile(self, config: StageConfig, caps: Capabilities) -> str | None:
        """Why ``config`` is not worth a trial on a device with ``caps`` (None: it is)."""
        return self.worthwhile(self.own(config), caps) if self.worthwhile is not None else None

    def ruled_out(self, config: StageConfig, facts: ModelFacts) -> str | None:
        """Why ``config`` cannot change the model ``facts`` describe (None: it may)."""
        return self.rules_out(self.own(config), facts) if self.rules_out is not None else None

    def cannot_follow(self, config: StageConfig, upstream: Sequence[StageConfig]) -> str | None:
        """Why ``config`` cannot apply after the ``upstream`` configs (None: it may)."""
        return self.after(self.own(config), upstream) if self.after is not None else None

    def precision_of(self, config: StageConfig) -> str | None:
        """The matmul precision ``config`` runs in (None: float32, or the stage declares none)."""
        return self.precision(self.own(config)) if self.precision is not None else None

    def short_of(self, config: StageConfig) -> str | None:
        """``config`` in the short notation (None: the stage declares none)."""
        return self.short(self.own(config)) if self.short is not None else None

    def mirror_of(self, config: StageConfig) -> ExportMirror:
        """What exports must reproduce of ``config`` (empty for float-graph stages)."""
        if isinstance(self.mirror, NotMirrored):
            return ExportMirror(not_mirrored=(f"{self.name}: {self.mirror.reason}",))
        return self.mirror(self.own(config)) if self.mirror is not None else ExportMirror()


#: Entry-point group through which stage packages declare their stages
#: (``[project.entry-points."paretorch.stages"] name = "module:STAGE"``).
ENTRY_POINT_GROUP = "paretorch.stages"

#: The registry: each stage under its config type.
_STAGES: dict[type[StageConfig], Stage[StageConfig]] = {}
_entry_points_loaded = False


def _by_name() -> Mapping[str, Stage[StageConfig]]:
    return {stage.name: stage for stage in _STAGES.values()}


def register_stage(stage: Stage[C]) -> Stage[C]:
    """Add ``stage`` to the registry under its config type (entry points do this for installed packages)."""
    known = _STAGES.get(stage.config_type) or _by_name().get(stage.name)
    if known is not None and known is not stage:
        raise ConfigError(f"stage '{stage.name}' is registered twice")
    _STAGES[stage.config_type] = stage
    return stage


def unregister_stage(name: str) -> None:
    """Remove a stage (tests and plugins that replace one)."""
    if (stage := _by_name().get(name)) is not None:
        del _STAGES[stage.config_type]


@contextmanager
def registered(*stages: Stage[StageConfig]) -> Iterator[None]:
    """Register ``stages`` for the ``with`` block only (tests, notebooks)."""
    _ensure_loaded()
    for stage in stages:
        register_stage(stage)
    try:
        yield
    finally:
        for stage in stages:
            unregister_stage(stage.name)


def load_entry_points(group: str = ENTRY_POINT_GROUP) -> None:
    """Register every stage that an installed distribution declares in ``group``.

    Each entry point names a :class:`Stage` object; its name must be the stage's name.
    Loading imports the stage's module, so a plugin that fails to import is an error
    naming the entry point.
    """
    for stage in load_group(group, "stage", Stage, lambda s: s.name, known=set(_by_name())):
        register_stage(stage)


def _ensure_loaded() -> None:
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        load_entry_points()


def registered_stages() -> dict[str, Stage[StageConfig]]:
    """All stages, by name: the installed entry points plus any registered in code."""
    _ensure_loaded()
    return dict(_by_name())


def get_stage(name: str) -> Stage[StageConfig]:
    stages = registered_stages()
    if name not in stages:
        raise ConfigError(f"unknown stage '{name}': known stages are {', '.join(sorted(stages))}")
    return stages[name]


def stage_for(config: C) -> Stage[C]:
    """The stage of ``config``, found by its class (or the nearest registered base class)."""
    _ensure_loaded()
    for kind in type(config).__mro__:
        if kind in _STAGES:
            # The key is the stage's config type and a base of type(config): its functions take ``config``.
            return cast("Stage[C]", _STAGES[kind])
    stage = get_stage(config.stage)  # an unknown name is a ConfigError listing the known stages
    raise TypeError(f"{type(config).__name__} is not the config type of stage '{stage.name}'")


def is_export(config: StageConfig) -> bool:
    """Whether ``config`` configures an export stage."""
    return stage_for(config).is_export


def default_order() -> tuple[list[Stage[StageConfig]], list[Stage[StageConfig]]]:
    """The default pipeline's model stages and exports, each in ``order``."""
    placed = sorted((s for s in registered_stages().values() if s.order is not None), key=lambda s: (s.order, s.name))
    return [s for s in placed if not s.is_export], [s for s in placed if s.is_export]


def export_mirror(configs: Sequence[StageConfig]) -> ExportMirror:
    """The merged :class:`ExportMirror` of a recipe's model stages (the last config of each stage counts)."""
    latest: dict[str, StageConfig] = {}
    for config in configs:
        latest[config.stage] = config
    merged = ExportMirror()
    for config in latest.values():
        stage = stage_for(config)
        if not stage.is_export:
            merged = merged.merge(stage.mirror_of(config))
    return merged


def config_from_dict(data: object) -> StageConfig:
    """Inverse of :meth:`StageConfig.to_dict`; errors name the stage and the field."""
    if not isinstance(data, Mapping) or "stage" not in data:
        raise ConfigError(f"a stage config must be an object with a 'stage' key, got {data!r}")
    fields = {k: v for k, v in data.items() if k != "stage"}
    stage = get_stage(str(data["stage"]))
    try:
        return stage.config_type.model_validate(fields)
    except ValidationError as exc:
        raise ConfigError(f"invalid {stage.name} config: {format_validation_error(exc)}") from exc


def apply_stage(model: nn.Module, config: StageConfig, ctx: StageContext) -> StageOutput:
    """Run ``config``'s stage on a deep copy of ``model``: the new model, or an export's result."""
    stage = stage_for(config)
    reason = stage.unavailable(config, ctx.capabilities)
    if reason is not None:
        raise InfeasibleConfig(f"{stage.name}: {reason}")
    ctx.resolved_config = None
    return stage.run(copy.deepcopy(model), config, ctx)


def transform(model: nn.Module, config: StageConfig, ctx: StageContext) -> nn.Module:
    """:func:`apply_stage` of a model stage: the new model (an export stage's config is a TypeError)."""
    result = apply_stage(model, config, ctx)
    if not isinstance(result, nn.Module):
        raise TypeError(f"stage '{config.stage}' is an export stage: it returned a {type(result).__name__}, "
                        "not a model")
    return result


#: Scripted reuse of one stage: ``apply(model, PruneConfig(ratio=0.3), ctx)``.
apply = apply_stage
