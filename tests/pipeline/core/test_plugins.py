"""The one entry-point loader of stages and runtimes: a broken plugin is one error naming its entry point."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from paretorch.pipeline.core import plugins
from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.runtimes.base import Runtime

GROUP = "paretorch.runtimes"


def _load(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> list[Runtime]:
    monkeypatch.setattr(plugins.importlib.metadata, "entry_points",
                        lambda group: [EntryPoint(name, value, group)] if group == GROUP else [])
    return plugins.load_group(GROUP, "runtime", Runtime, lambda r: r.name)  # type: ignore[type-abstract]


def test_a_declared_runtime_loads_under_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    (runtime,) = _load(monkeypatch, "eager", "paretorch.pipeline.core.runtimes.eager:EAGER")
    assert runtime.name == "eager"


@pytest.mark.parametrize(("name", "value", "error"), [
    ("broken", "no_such_module_here:RUNTIME",
     r"^runtime entry point 'broken' \(no_such_module_here:RUNTIME\) failed to load: ModuleNotFoundError"),
    ("eager", "paretorch.pipeline.core.runtimes.eager:Eager",
     r"^runtime entry point 'eager' \(paretorch.pipeline.core.runtimes.eager:Eager\) is a ABCMeta, not a "
     r"paretorch.pipeline.core.runtimes.base.Runtime"),
    ("fast", "paretorch.pipeline.core.runtimes.eager:EAGER",
     r"^runtime entry point 'fast' names runtime 'eager': the entry-point name must be the runtime name"),
])
def test_a_broken_plugin_is_one_error_naming_its_entry_point(monkeypatch: pytest.MonkeyPatch, name: str,
                                                              value: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        _load(monkeypatch, name, value)
