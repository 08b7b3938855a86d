"""A recipe: the ordered, resolved stage configs of one trial plus its runtime.

It is what a user keeps, diffs and replays (``python -m paretorch apply --recipe
FILE``). Model stages come first in the order they ran, exports last; every
config is the fully determined one the stage applied (e.g. the AMP policy that
calibration chose), so a replay needs no search and no calibration choices.

JSON form::

    {"format": "paretorch-recipe/1", "model": "digits", "runtime": "eager",
     "stages": [{"stage": "prune", ...}, {"stage": "export.onnx", ...}],
     "metadata": {"study": ..., "trial": 3, "accuracy": 0.99, ...}}
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic_core import PydanticUndefined

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.runtimes.registry import check_runtime_names
from paretorch.pipeline.core.stage import StageConfig, config_from_dict, is_export

RECIPE_FORMAT = "paretorch-recipe/1"
OFF = "off"


@dataclass(frozen=True)
class Recipe:
    """Ordered stage configs (model stages, then exports), the runtime, and where it came from."""

    stages: tuple[StageConfig, ...] = ()
    runtime: str = DEFAULT_RUNTIME
    model: str | None = None
    metadata: dict[str, object] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, object]:
        return {
            "format": RECIPE_FORMAT,
            "model": self.model,
            "runtime": self.runtime,
            "stages": [config.to_dict() for config in self.stages],
            "metadata": self.metadata,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, default=str)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Recipe:
        if not isinstance(data, Mapping):
            raise ConfigError(f"a recipe must be a JSON object, got {type(data).__name__}")
        if data.get("format", RECIPE_FORMAT) != RECIPE_FORMAT:
            raise ConfigError(f"unknown recipe format {data.get('format')!r}: this version reads {RECIPE_FORMAT}")
        raw_stages = data.get("stages", [])
        if not isinstance(raw_stages, list):
            raise ConfigError("a recipe's 'stages' must be a list of stage configs")
        configs = tuple(config_from_dict(item) for item in raw_stages)
        runtime = str(data.get("runtime", DEFAULT_RUNTIME))
        check_runtime_names([runtime], " in the recipe")
        model = data.get("model")
        if model is not None and not isinstance(model, str):
            raise ConfigError(f"a recipe's 'model' must be a spec name, got {model!r}")
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            raise ConfigError(f"a recipe's 'metadata' must be an object, got {type(metadata).__name__}")
        return cls(stages=configs, runtime=runtime, model=model, metadata=dict(metadata))

    @classmethod
    def from_json(cls, text: str) -> Recipe:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"recipe is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the recipe atomically (a reader never sees half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            handle.write(self.to_json())
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Recipe:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"recipe file not found: {path}")
        try:
            return cls.from_json(path.read_text())
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc

    def model_stages(self) -> tuple[StageConfig, ...]:
        return tuple(c for c in self.stages if not is_export(c))

    def exports(self) -> tuple[StageConfig, ...]:
        return tuple(c for c in self.stages if is_export(c))

    def describe(self, brief: bool = False, exports: bool = True) -> str:
        """One line: ``prune(ratio=0.3) + quantize(method=int8_dynamic) | compile | -> onnx, coreml``;
        ``brief``: lists as counts (``fp32_layers=[12 items]``; an empty one ``[]``, as everywhere), for console
        lines; ``exports=False``: without the exports the recipe names (where they have not run, or another column
        says which ran)."""
        body = " + ".join(describe_config(c, brief) for c in self.model_stages()) or "baseline"
        text = f"{body} | {self.runtime}"
        if exports and self.exports():
            text += " | -> " + ", ".join(c.stage.removeprefix("export.") for c in self.exports())
        return text

    def flat_params(self) -> dict[str, str]:
        """``{"runtime": "eager", "prune.ratio": "0.3", ...}`` (MLflow params)."""
        params = {"runtime": self.runtime}
        for config in self.stages:
            params.update(flatten_config(config.stage, config))
        return params


def describe_config(config: StageConfig, brief: bool = False) -> str:
    """``quantize(method=int8_dynamic)``: the stage with its required fields and the fields
    that differ from their defaults (the full config is in the recipe JSON); ``brief``: a list
    shows as its count."""
    shown = []
    values = config.model_dump(mode="json")
    for name, info in type(config).model_fields.items():
        default = info.get_default(call_default_factory=True) if info.default is not PydanticUndefined or \
            info.default_factory is not None else PydanticUndefined
        value = values.get(name)
        if default is PydanticUndefined or _json(default) != value:
            if brief and isinstance(value, list) and value:  # an empty list reads [] everywhere
                shown.append(f"{name}=[{len(value)} items]")
            else:
                shown.append(f"{name}={value:.3g}" if isinstance(value, float) else f"{name}={value}")
    return f"{config.stage}({', '.join(shown)})"


def _json(value: object) -> object:
    try:
        return json.loads(json.dumps(value))
    except TypeError:
        return str(value)


def flatten_config(prefix: str, config: StageConfig | None) -> dict[str, str]:
    """One config as flat string params under ``prefix``; ``None`` is ``{prefix: "off"}``."""
    if config is None:
        return {prefix: OFF}
    values = config.model_dump(mode="json")
    if not values:
        return {prefix: "on"}
    out: dict[str, str] = {}
    for key, value in values.items():
        out[f"{prefix}.{key}"] = value if isinstance(value, str) else json.dumps(value)
    return out


def flatten_node_configs(configs: Mapping[str, StageConfig | None], runtime: str) -> dict[str, str]:
    """Per-node configs of a trial (off stages included) as flat MLflow params."""
    params = {"runtime": runtime}
    for node, config in configs.items():
        params.update(flatten_config(node, config))
    return params


def configs_to_json(configs: Mapping[str, StageConfig | None]) -> dict[str, dict[str, object] | None]:
    """``{node: config dict | None}``: how a trial stores its per-node choices."""
    return {node: (config.to_dict() if config is not None else None) for node, config in configs.items()}


def configs_from_json(data: Mapping[str, object]) -> dict[str, StageConfig | None]:
    return {node: (config_from_dict(raw) if raw is not None else None) for node, raw in data.items()}
