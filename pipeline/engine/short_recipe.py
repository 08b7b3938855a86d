"""The short notation of a recipe, the one the console (trial lines, the Pareto table, ``apply``) and run names use:
``prune 0.3 + distill 200 + int8s | ort``.

It says what ran in the fewest characters: each model stage as its method and amount (exports are left out:
another column or line says which ran), then the runtime. The full, replayable recipe stays in the recipe file,
the Optuna trial and the MLflow run (:meth:`paretorch.pipeline.engine.recipe.Recipe.describe`).

Each stage writes its own configs (:attr:`paretorch.pipeline.core.stage.Stage.short`) and each runtime its own label
(:meth:`paretorch.pipeline.core.runtimes.base.Runtime.short`); a stage that declares no short form shows as its name
followed by the values of its required fields (:mod:`paretorch.pipeline.core.short_notation`: a number with two
significant digits, a list as its length), a runtime not installed here as its name.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic_core import PydanticUndefined

from paretorch.pipeline.core.runtimes.registry import registered_runtimes
from paretorch.pipeline.core.short_notation import short_value
from paretorch.pipeline.core.stage import StageConfig, is_export, stage_for

#: What a recipe with no model stage shows (the model as it came).
UNCHANGED = "baseline"


def short_recipe(stages: Iterable[StageConfig | None], runtime: str) -> str:
    """``prune 0.3 + distill 200 + int8s | ort``: the model stages of ``stages`` (None entries and exports
    skipped), in order, then the runtime; ``baseline | eager`` when no model stage ran."""
    parts = [short_stage(config) for config in stages if config is not None and not is_export(config)]
    return f"{' + '.join(parts) or UNCHANGED} | {short_runtime(runtime)}"


def short_runtime(name: str) -> str:
    """The runtime's declared short label (a runtime not installed here: its name, as a stored trial names it)."""
    runtime = registered_runtimes().get(name)
    return runtime.short() if runtime is not None else name


def short_stage(config: StageConfig) -> str:
    """One stage in the short notation (see the module docstring)."""
    declared = stage_for(config).short_of(config)
    if declared is not None:
        return declared
    values = config.model_dump(mode="json")
    required = [short_value(values[name]) for name, info in type(config).model_fields.items()
                if info.default is PydanticUndefined and info.default_factory is None and name in values]
    return " ".join([config.stage, *required])
