"""The short notation of a recipe, the one the console (trial lines, the Pareto table, ``apply``) and run names use:
``prune 0.3 + distill 200 + int8s | ort``.

It says what ran in the fewest characters: each model stage as its method and amount (exports are left out:
another column or line says which ran), then the runtime. The full, replayable recipe stays in the recipe file,
the Optuna trial and the MLflow run (:meth:`paretorch.pipeline.engine.recipe.Recipe.describe`).

One short form per stage name below; a stage this table does not know (a plugin) shows as its name followed by
the values of its required fields. A number shows with two significant digits, a list as its length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic_core import PydanticUndefined

from paretorch.pipeline.core.stage import StageConfig, is_export

#: What a recipe with no model stage shows (the model as it came).
UNCHANGED = "baseline"

#: Runtime names as the short notation writes them (a runtime not listed keeps its name).
RUNTIME_SHORT = {
    "onnxruntime": "ort",
    "openvino": "ov",
    "compile_dynamic": "compile-dyn",
    "compile_cudagraphs": "cudagraphs",
}

#: Reduced dtypes as the short notation writes them.
DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "auto": "amp"}


def short_recipe(stages: Iterable[StageConfig | None], runtime: str) -> str:
    """``prune 0.3 + distill 200 + int8s | ort``: the model stages of ``stages`` (None entries and exports
    skipped), in order, then the runtime; ``baseline | eager`` when no model stage ran."""
    parts = [short_stage(config) for config in stages if config is not None and not is_export(config)]
    return f"{' + '.join(parts) or UNCHANGED} | {short_runtime(runtime)}"


def short_runtime(name: str) -> str:
    return RUNTIME_SHORT.get(name, name)


def short_stage(config: StageConfig) -> str:
    """One stage in the short notation (see the module docstring)."""
    values = config.model_dump(mode="json")
    form = _FORMS.get(config.stage)
    if form is not None:
        return form(values)
    required = [_value(values[name]) for name, info in type(config).model_fields.items()
                if info.default is PydanticUndefined and info.default_factory is None and name in values]
    return " ".join([config.stage, *required])


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2g}"
    if isinstance(value, list | tuple):
        return f"[{len(value)}]"
    return str(value)


def _kept(count: int, dtype: str = "fp32") -> str:
    """`` (3 fp32)``: layers left out of a numeric stage; empty when none are."""
    return f" ({count} {dtype})" if count else ""


def _prune(c: Mapping[str, Any]) -> str:
    """``prune 0.3``; ``prune depth 0.25`` / ``prune sparse 0.5``; ``prune heads 0.25`` (FFN widths kept),
    ``prune ffn 0.25`` (heads kept); other head / FFN ratios follow as ``heads 0.1 ffn 0.4``."""
    ratio, heads, ffn = c["ratio"], c.get("head_ratio"), c.get("ffn_ratio")
    if c.get("method") == "depth":
        return f"prune depth {_value(ratio)}"
    if c.get("method") == "unstructured":
        return f"prune sparse {_value(ratio)}"
    if ffn == 0 and heads != 0:
        return f"prune heads {_value(ratio if heads is None else heads)}"
    if heads == 0 and ffn != 0:
        return f"prune ffn {_value(ratio if ffn is None else ffn)}"
    text = f"prune {_value(ratio)}"
    for name, value in (("heads", heads), ("ffn", ffn)):
        if value is not None and value != ratio:
            text += f" {name} {_value(value)}"
    return text


def _distill(c: Mapping[str, Any]) -> str:
    """``distill 200``: the steps that ran (a time budget that stopped it early resolves to ``stop_step``)."""
    return f"distill {c.get('stop_step') or c['steps']}"


def _quantize(c: Mapping[str, Any]) -> str:
    """``int8s`` for ``int8_static_pt2e``: the method's first word and the initial of its second (``float``
    as ``fp``: ``fp8d``), a non-default group size (``int4w g32``), ``asym``, and the layers kept float."""
    words = str(c["method"]).replace("float", "fp").split("_")
    text = words[0] + (words[1][:1] if len(words) > 1 else "")
    if c.get("group_size", 128) != 128:
        text += f" g{c['group_size']}"
    if c.get("mapping") == "asymmetric":
        text += " asym"
    return text + _kept(len(c.get("float_layers") or ()), "float")


def _amp(c: Mapping[str, Any]) -> str:
    """``bf16`` (the whole model), ``bf16 (12 fp32)`` (12 layers kept in float32)."""
    return DTYPE_SHORT.get(str(c.get("dtype")), str(c.get("dtype"))) + _kept(len(c.get("fp32_layers") or ()))


_FORMS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "prune": _prune,
    "distill": _distill,
    "pack": lambda c: "pack",
    "quantize": _quantize,
    "amp": _amp,
}
