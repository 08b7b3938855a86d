"""Loading extension points from entry-point groups: the one loader behind the stage and runtime registries.

Each entry point names one object (a :class:`~paretorch.pipeline.core.stage.Stage`, a
:class:`~paretorch.pipeline.core.runtimes.base.Runtime`) whose own name must be the entry point's; a plugin that fails
to import, names another kind of object or another name is one :class:`ConfigError` naming the entry point.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Collection
from typing import TypeVar

from paretorch.pipeline.core.errors import ConfigError

T = TypeVar("T")


def load_group(group: str, kind: str, expected: type[T], name_of: Callable[[T], str],
               known: Collection[str] = ()) -> list[T]:
    """The objects the installed distributions declare in ``group`` (those named in ``known`` skipped), each
    checked to be an ``expected`` whose ``name_of`` is its entry point's name (``kind`` names them in errors)."""
    loaded: list[T] = []
    for entry_point in importlib.metadata.entry_points(group=group):
        if entry_point.name in known:
            continue
        try:
            value = entry_point.load()
        except Exception as exc:  # a plugin's import error, whatever it is
            raise ConfigError(f"{kind} entry point '{entry_point.name}' ({entry_point.value}) failed to load: "
                              f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(value, expected):
            raise ConfigError(f"{kind} entry point '{entry_point.name}' ({entry_point.value}) is a "
                              f"{type(value).__name__}, not a {expected.__module__}.{expected.__qualname__}")
        if name_of(value) != entry_point.name:
            raise ConfigError(f"{kind} entry point '{entry_point.name}' names {kind} '{name_of(value)}': "
                              f"the entry-point name must be the {kind} name")
        loaded.append(value)
    return loaded
