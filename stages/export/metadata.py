"""What every exported artifact carries: the recipe that made it and the library versions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import metadata

from paretorch.pipeline.core.stage import StageConfig

RECIPE_KEY = "paretorch.recipe"
VERSIONS_KEY = "paretorch.versions"
BASE_LIBRARIES = ("paretorch", "torch", "torchao", "torch-pruning")


def recipe_json(configs: Sequence[StageConfig]) -> str:
    """The recipe before the export as JSON: ``[config.to_dict(), ...]``."""
    return json.dumps([config.to_dict() for config in configs], sort_keys=True)


def library_versions(*extra: str) -> dict[str, str]:
    """Installed versions of the base libraries and ``extra`` (absent ones are left out)."""
    versions: dict[str, str] = {}
    for name in (*BASE_LIBRARIES, *extra):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def artifact_metadata(configs: Sequence[StageConfig], *libraries: str) -> dict[str, str]:
    """String key/value metadata for an artifact: the recipe and the versions as JSON."""
    return {
        RECIPE_KEY: recipe_json(configs),
        VERSIONS_KEY: json.dumps(library_versions(*libraries), sort_keys=True),
    }
