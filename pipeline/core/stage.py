"""The stage API: what a stage is, what it may read, and the one registry of stages.

A stage is one :class:`Stage` record built in the stage's own module: a frozen,
validated config class (with its search space, ``suggest``) plus one pure function
``apply(model, config, ctx)``, how exports mirror it, what it needs from the
device and where it sits in the default pipeline. Transform stages return a new
model; export stages return an :class:`ExportResult`. :func:`apply_stage` hands the
function a deep copy, so a stage can never change its caller's model.

Stages are found through the ``paretorch.stages`` entry-point group
(:data:`ENTRY_POINT_GROUP`): the built-ins declare theirs in ``pyproject.toml``, a
separately installed package does the same. Nothing in ``pipeline`` imports a stage.
"""

from __future__ import annotations

import copy
import importlib.metadata
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn

from pipeline.core.device import Capabilities, capabilities
from pipeline.core.errors import ConfigError, InfeasibleConfig
from pipeline.core.mirror import ExportMirror, NotMirrored
from pipeline.core.model_facts import ModelFacts
from pipeline.core.spec import Batch, ModelSpec, move_batch

if TYPE_CHECKING:
    import optuna


class StageConfig(BaseModel):
    """Base of every stage config: frozen, unknown fields rejected, validated on construction.

    Subclasses set ``stage`` (the registry name) and implement :meth:`suggest`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    stage: ClassVar[str] = ""

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        """This stage's search space: a config for ``trial``, or None (stage off).

        Written with plain ``trial.suggest_*`` calls; parameter names are
        prefixed with the stage name so that they stay unique in a study.
        """
        raise NotImplementedError(f"{cls.__name__} has no search space")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the stage name under ``"stage"``."""
        return {"stage": self.stage, **self.model_dump(mode="json")}

    def describe(self) -> str:
        """One short line for tables: ``prune(ratio=0.3, importance=l2)``."""
        fields = ", ".join(f"{k}={v}" for k, v in self.model_dump(mode="json").items() if v not in (None, [], ()))
        return f"{self.stage}({fields})"

    def low_fidelity(self) -> StageConfig | None:
        """A cheaper config of this stage whose outcome predicts this one's (e.g. a quarter of the
        distillation steps), which a search runs first to screen out a costly trial that cannot reach
        the front (:mod:`pipeline.search.screening`); None: the stage is not costly."""
        return None

    def budget_use(self) -> BudgetUse | None:
        """The output-error budget this (resolved) config held by keeping layers in float, if any.

        Stages rank layers by output error, a proxy; the trial's verdict is the task metric.
        The search records both, so that a budget stricter than the task needs is visible."""
        return None


@dataclass(frozen=True)
class BudgetUse:
    """An output-error budget a stage held, and what it cost: layers left in float for it."""

    name: str  # the config field, e.g. "quantize.fallback_budget"
    budget: float
    float_layers: int


class ExportConfig(StageConfig):
    """Base of export stage configs: exports are not searched, ``suggest`` returns the defaults."""

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> Self | None:
        return cls()


@dataclass(frozen=True)
class ExportResult:
    """What an export stage produced: a file or package, and how it was checked."""

    format: str
    path: Path
    size_bytes: int
    #: How the export was checked, said plainly: e.g. "reloaded; inputs/outputs checked
    #: (predict needs macOS)" or "onnxruntime matches torch (max abs err 2e-6)".
    validation: str
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class StageContext:
    """What a stage may read besides the model: the device, the spec's data,
    where to write files, and the recipe so far. Stages record extra results
    (e.g. AMP sensitivities) with :meth:`record` and may hand back the fully
    determined config they applied with :meth:`resolve` (kept in the recipe)."""

    spec: ModelSpec
    device: torch.device
    output_dir: Path | None = None
    #: Resolved configs of the stages applied before this one, in order.
    upstream: tuple[StageConfig, ...] = ()
    records: dict[str, Any] = field(default_factory=dict)
    resolved_config: StageConfig | None = None
    #: For export stages: the model after the structural stages (pruning) but
    #: before the numeric ones (quantize, amp), i.e. the float graph that Core ML
    #: and ONNX convert before mirroring the recipe's compression. None: same as
    #: the model handed to the stage.
    float_model: nn.Module | None = None
    #: Content key of the input model (the runner's cache key: same key, same model),
    #: so a stage may reuse work it did on that model before. None: unknown (scripted use).
    input_key: str | None = None
    #: The unoptimized model the pipeline started from (the runner's source model; do not
    #: modify it), e.g. the teacher of distillation. None: unknown (scripted use of one stage).
    source_model: nn.Module | None = None
    #: What the stages know about the unoptimized model (a search reads them once per study), so that
    #: ``suggest`` offers no choice that cannot change this model (:meth:`offered`). None: unknown.
    facts: ModelFacts | None = None
    #: The choices each categorical param already has in the study: Optuna cannot change a
    #: categorical's choices within a study, so :meth:`offered` keeps them.
    study_choices: Mapping[str, Sequence[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.device, str):  # scripted use: StageContext(spec, "cpu")
            self.device = torch.device(self.device)
        if isinstance(self.output_dir, str):
            self.output_dir = Path(self.output_dir)

    @property
    def capabilities(self) -> Capabilities:
        return capabilities(self.device)

    @cached_property
    def calibration_batches(self) -> list[Batch]:
        """The spec's calibration batches, on the device (loaded once)."""
        return [move_batch(batch, self.device) for batch in self.spec.calibration()]

    def example_inputs(self, batch_size: int = 2) -> Batch:
        return move_batch(self.spec.example_inputs(batch_size), self.device)

    def record(self, key: str, value: Any) -> None:
        self.records[key] = value

    def resolve(self, config: StageConfig) -> None:
        self.resolved_config = config

    def offered(self, name: str, choices: Sequence[T], why_not: Callable[[T], str | None]) -> list[T]:
        """The choices of the categorical param ``name`` worth a trial on this model: those ``why_not``
        (the stage's ``rules_out`` of a config with that choice, read against :attr:`facts`) gives no
        reason against. Without facts, all of them; in a study that fixed the param's choices before,
        those (a ruled-out one is then answered before it runs, not run)."""
        if name in self.study_choices:
            return list(self.study_choices[name])
        if self.facts is None:
            return list(choices)
        return [choice for choice in choices if why_not(choice) is None]

    def upstream_config(self, config_type: type[C]) -> C | None:
        """The last upstream config of ``config_type``, if the recipe has one."""
        for config in reversed(self.upstream):
            if isinstance(config, config_type):
                return config
        return None

    def require_output_dir(self) -> Path:
        if self.output_dir is None:
            raise ConfigError("this stage writes files: give StageContext an output_dir")
        self.output_dir.mkdir(parents=True, exist_ok=True)
        return self.output_dir


C = TypeVar("C", bound=StageConfig)
T = TypeVar("T")
ApplyFn = Callable[[nn.Module, Any, StageContext], Any]


MirrorFn = Callable[[Any], ExportMirror]
#: What a config needs from the device: a reason it cannot run there, or None.
RequiresFn = Callable[[Any, Capabilities], str | None]
#: Cheap facts a stage reads about the unoptimized model (once per study), e.g. its removable blocks.
FactsFn = Callable[[nn.Module, "StageContext"], Any]
#: Why a config cannot change the model these facts describe, or None.
RulesOutFn = Callable[[Any, ModelFacts], str | None]


@dataclass(frozen=True)
class Stage:
    """One stage, everything about it in one record (built in the stage's own module).

    * ``config_type`` and ``apply``: the frozen config (with its ``suggest``) and the
      pure function; ``apply(model, config, ctx)`` returns a model, or an
      :class:`ExportResult` when ``produces="export"``.
    * ``numeric``: the stage changes numerics (quantize, amp), not the float graph;
      Core ML / ONNX convert the model before it and must mirror it.
    * ``mirror``: how exports reproduce it (see :mod:`pipeline.core.mirror`): a function
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
      reads once per study (a Python model only; see :mod:`pipeline.core.model_facts`).
    * ``rules_out``: ``(config, ModelFacts) -> reason | None``: why ``config`` cannot change this
      model (no layer it touches, no block it removes, a TorchScript model it cannot act on);
      a search checks every stage of a trial's chain before any of them runs, and such a
      configuration is not a trial. ``suggest`` reads it through :meth:`StageContext.offered`.
    """

    config_type: type[StageConfig]
    apply: ApplyFn
    produces: Literal["model", "export"] = "model"
    numeric: bool = False
    mirror: MirrorFn | NotMirrored | None = None
    requires: RequiresFn | None = None
    order: int | None = None
    worthwhile: RequiresFn | None = None
    facts: FactsFn | None = None
    rules_out: RulesOutFn | None = None

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

    def unavailable(self, config: StageConfig, caps: Capabilities) -> str | None:
        """Why ``config`` cannot run on a device with ``caps`` (None: it can)."""
        return self.requires(config, caps) if self.requires is not None else None

    def not_worthwhile(self, config: StageConfig, caps: Capabilities) -> str | None:
        """Why ``config`` is not worth a trial on a device with ``caps`` (None: it is)."""
        return self.worthwhile(config, caps) if self.worthwhile is not None else None

    def ruled_out(self, config: StageConfig, facts: ModelFacts) -> str | None:
        """Why ``config`` cannot change the model ``facts`` describe (None: it may)."""
        return self.rules_out(config, facts) if self.rules_out is not None else None

    def mirror_of(self, config: StageConfig) -> ExportMirror:
        """What exports must reproduce of ``config`` (empty for float-graph stages)."""
        if isinstance(self.mirror, NotMirrored):
            return ExportMirror(not_mirrored=(f"{self.name}: {self.mirror.reason}",))
        return self.mirror(config) if self.mirror is not None else ExportMirror()


#: Entry-point group through which stage packages declare their stages
#: (``[project.entry-points."paretorch.stages"] name = "module:STAGE"``).
ENTRY_POINT_GROUP = "paretorch.stages"

_STAGES: dict[str, Stage] = {}
_entry_points_loaded = False


def register_stage(stage: Stage) -> Stage:
    """Add ``stage`` to the registry (entry points do this for installed packages)."""
    if stage.name in _STAGES and _STAGES[stage.name] is not stage:
        raise ConfigError(f"stage '{stage.name}' is registered twice")
    _STAGES[stage.name] = stage
    return stage


def unregister_stage(name: str) -> None:
    """Remove a stage (tests and plugins that replace one)."""
    _STAGES.pop(name, None)


@contextmanager
def registered(*stages: Stage) -> Iterator[None]:
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
    for entry_point in importlib.metadata.entry_points(group=group):
        if entry_point.name in _STAGES:
            continue
        try:
            stage = entry_point.load()
        except Exception as exc:  # a plugin's import error, whatever it is
            raise ConfigError(
                f"stage entry point '{entry_point.name}' ({entry_point.value}) failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(stage, Stage):
            raise ConfigError(f"stage entry point '{entry_point.name}' ({entry_point.value}) is a "
                              f"{type(stage).__name__}, not a pipeline.core.stage.Stage")
        if stage.name != entry_point.name:
            raise ConfigError(f"stage entry point '{entry_point.name}' names stage '{stage.name}': "
                              "the entry-point name must be the stage name")
        register_stage(stage)


def _ensure_loaded() -> None:
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        load_entry_points()


def registered_stages() -> dict[str, Stage]:
    """All stages, by name: the installed entry points plus any registered in code."""
    _ensure_loaded()
    return dict(_STAGES)


def get_stage(name: str) -> Stage:
    stages = registered_stages()
    if name not in stages:
        raise ConfigError(f"unknown stage '{name}': known stages are {', '.join(sorted(stages))}")
    return stages[name]


def stage_for(config: StageConfig) -> Stage:
    stage = get_stage(config.stage)
    if not isinstance(config, stage.config_type):
        raise TypeError(f"{type(config).__name__} is not the config type of stage '{stage.name}'")
    return stage


def is_export(config: StageConfig) -> bool:
    """Whether ``config`` configures an export stage."""
    return stage_for(config).is_export


def default_order() -> tuple[list[Stage], list[Stage]]:
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


def config_from_dict(data: dict[str, Any]) -> StageConfig:
    """Inverse of :meth:`StageConfig.to_dict`; errors name the stage and the field."""
    if not isinstance(data, dict) or "stage" not in data:
        raise ConfigError(f"a stage config must be an object with a 'stage' key, got {data!r}")
    fields = {k: v for k, v in data.items() if k != "stage"}
    stage = get_stage(str(data["stage"]))
    try:
        return stage.config_type(**fields)
    except ValidationError as exc:
        raise ConfigError(f"invalid {stage.name} config: {format_validation_error(exc)}") from exc


def format_validation_error(exc: ValidationError) -> str:
    """'ratio=1.5: Input should be less than 1' for each failing field, on one line."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "config"
        parts.append(f"{where}={error.get('input')!r}: {error['msg']}")
    return "; ".join(parts)


def apply_stage(model: nn.Module, config: StageConfig, ctx: StageContext) -> Any:
    """Run ``config``'s stage on a deep copy of ``model``."""
    stage = stage_for(config)
    reason = stage.unavailable(config, ctx.capabilities)
    if reason is not None:
        raise InfeasibleConfig(f"{stage.name}: {reason}")
    ctx.resolved_config = None
    return stage.apply(copy.deepcopy(model), config, ctx)


#: Scripted reuse of one stage: ``apply(model, PruneConfig(ratio=0.3), ctx)``.
apply = apply_stage
