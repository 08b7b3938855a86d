"""What a stage is configured by: :class:`StageConfig` (frozen, validated, with its search space) and
:class:`ExportConfig` for export stages, plus :class:`BudgetUse`, what a config's output-error budget
cost. Part of the stage API; plugins import it from :mod:`paretorch.pipeline.core.stage`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

if TYPE_CHECKING:
    import optuna

    from paretorch.pipeline.core.stage_context import StageContext


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

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form, with the stage name under ``"stage"``."""
        return {"stage": self.stage, **self.model_dump(mode="json")}

    def describe(self) -> str:
        """One short line for tables: ``prune(ratio=0.3, importance=l2)``."""
        fields = ", ".join(f"{k}={v}" for k, v in self.model_dump(mode="json").items() if v not in (None, [], ()))
        return f"{self.stage}({fields})"

    def low_fidelity(self) -> StageConfig | None:
        """A cheaper config of this stage whose outcome predicts this one's (e.g. a quarter of the
        distillation steps), which a search runs first to screen out a costly trial that cannot reach
        the front (:mod:`paretorch.pipeline.search.screening`); None: the stage is not costly."""
        return None

    def structure_only(self) -> StageConfig | None:
        """This config without what trains or tunes weight values (e.g. fine-tuning steps): what rebuilds the
        model's structure for saved weights to be loaded into (:func:`paretorch.pipeline.api.load_deployment`). None:
        the stage changes weight values only (distillation), a rebuild skips it. The default: the config itself."""
        return self

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




def format_validation_error(exc: ValidationError) -> str:
    """'ratio=1.5: Input should be less than 1' for each failing field, on one line."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "config"
        parts.append(f"{where}={error.get('input')!r}: {error['msg']}")
    return "; ".join(parts)
