"""The one registry of stages, keyed by name and by config type.

A stage is a frozen, validated config class plus one pure function
``apply(model, config, ctx)``. Transform stages return a new model; export
stages return an :class:`ExportResult`. :func:`apply_stage` hands the function
a deep copy, so a stage can never change its caller's model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn

from pipeline.device import Capabilities, capabilities
from pipeline.errors import ConfigError
from pipeline.spec import Batch, ModelSpec, move_batch

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
ApplyFn = Callable[[nn.Module, Any, StageContext], Any]


@dataclass(frozen=True)
class Stage:
    name: str
    config_type: type[StageConfig]
    apply: ApplyFn
    produces: Literal["model", "export"]
    #: True for stages that change numerics (quantize, amp) rather than structure;
    #: exports convert the model before these and mirror them.
    numeric: bool


_STAGES: dict[str, Stage] = {}


def register_stage(
    config_type: type[C], produces: Literal["model", "export"] = "model", numeric: bool = False
) -> Callable[[ApplyFn], ApplyFn]:
    """Decorator: register ``apply`` as the function of ``config_type``'s stage."""

    def decorator(apply: ApplyFn) -> ApplyFn:
        name = config_type.stage
        if not name:
            raise TypeError(f"{config_type.__name__} must set the class variable 'stage'")
        if name in _STAGES:
            raise TypeError(f"stage '{name}' is registered twice")
        _STAGES[name] = Stage(name=name, config_type=config_type, apply=apply, produces=produces, numeric=numeric)
        return apply

    return decorator


def registered_stages() -> dict[str, Stage]:
    """All stages, by name (importing :mod:`stages` registers the built-ins)."""
    return dict(_STAGES)


def get_stage(name: str) -> Stage:
    if name not in _STAGES:
        raise ConfigError(f"unknown stage '{name}': known stages are {', '.join(sorted(_STAGES))}")
    return _STAGES[name]


def stage_for(config: StageConfig) -> Stage:
    stage = get_stage(config.stage)
    if not isinstance(config, stage.config_type):
        raise TypeError(f"{type(config).__name__} is not the config type of stage '{stage.name}'")
    return stage


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
    ctx.resolved_config = None
    return stage.apply(copy.deepcopy(model), config, ctx)


#: Scripted reuse of one stage: ``apply(model, PruneConfig(ratio=0.3), ctx)``.
apply = apply_stage


def run_chain(
    model: nn.Module, configs: Sequence[StageConfig], ctx: StageContext
) -> tuple[nn.Module, list[ExportResult], list[StageConfig]]:
    """Apply transform stages in order, then exports; returns the final model,
    the export results and the resolved configs (the replayable recipe)."""
    resolved: list[StageConfig] = []
    exports: list[ExportResult] = []
    float_model = model
    for config in configs:
        stage = stage_for(config)
        step_ctx = StageContext(
            spec=ctx.spec,
            device=ctx.device,
            output_dir=ctx.output_dir,
            upstream=tuple(resolved),
            records=ctx.records,
            float_model=float_model,
        )
        result = apply_stage(model, config, step_ctx)
        resolved.append(step_ctx.resolved_config or config)
        if stage.produces == "export":
            exports.append(result)
        else:
            model = result
            if not stage.numeric:
                float_model = model
    return model, exports, resolved
