"""The one registry of runtimes, by name; names are validated here and nowhere else.

Runtimes are found through the ``paretorch.runtimes`` entry-point group (:data:`ENTRY_POINT_GROUP`), exactly
as stages are through ``paretorch.stages``: the built-ins declare theirs in ``pyproject.toml``, a separately
installed package does the same (``name = "module:RUNTIME"``, a :class:`~paretorch.pipeline.core.runtimes.base.Runtime`
instance whose ``name`` is the entry point's). Nothing here imports a runtime module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig
from paretorch.pipeline.core.machine_probe import EngineProbe, Gain
from paretorch.pipeline.core.names import BUILT_IN_RUNTIMES, RUNTIME_ENTRY_POINT_GROUP
from paretorch.pipeline.core.plugins import load_group
from paretorch.pipeline.core.runtimes.base import ExportHandle, NoExport, Runtime

#: Entry-point group through which packages declare their runtimes, and the built-ins' order (one table:
#: :mod:`paretorch.pipeline.core.names`, which the command line reads before torch).
ENTRY_POINT_GROUP = RUNTIME_ENTRY_POINT_GROUP
BUILT_IN_ORDER = BUILT_IN_RUNTIMES

_RUNTIMES: dict[str, Runtime] = {}
_entry_points_loaded = False


def register_runtime(runtime: Runtime) -> Runtime:
    """Add ``runtime`` under its name (entry points do this for installed packages)."""
    known = _RUNTIMES.get(runtime.name)
    if known is not None and known is not runtime:
        raise ConfigError(f"runtime '{runtime.name}' is registered twice")
    _RUNTIMES[runtime.name] = runtime
    return runtime


def unregister_runtime(name: str) -> None:
    """Remove a runtime (tests and plugins that replace one)."""
    _RUNTIMES.pop(name, None)


@contextmanager
def registered_runtime(*runtimes: Runtime) -> Iterator[None]:
    """Register ``runtimes`` for the ``with`` block only (tests, notebooks)."""
    _ensure_loaded()
    for runtime in runtimes:
        register_runtime(runtime)
    try:
        yield
    finally:
        for runtime in runtimes:
            unregister_runtime(runtime.name)


def load_entry_points(group: str = ENTRY_POINT_GROUP) -> None:
    """Register every runtime an installed distribution declares in ``group``; a plugin that fails to import or
    names something else is one error naming its entry point."""
    # Runtime is abstract: an isinstance check is all load_group does with it.
    for runtime in load_group(group, "runtime", Runtime, lambda r: r.name,  # type: ignore[type-abstract]
                              known=set(_RUNTIMES)):
        register_runtime(runtime)


def _ensure_loaded() -> None:
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        load_entry_points()


def registered_runtimes() -> dict[str, Runtime]:
    """Every runtime, by name, in the console's order: the built-ins first, then the plugins' by name."""
    _ensure_loaded()
    order = {name: i for i, name in enumerate(BUILT_IN_ORDER)}
    names = sorted(_RUNTIMES, key=lambda name: (order.get(name, len(order)), name))
    return {name: _RUNTIMES[name] for name in names}


def runtime_names() -> tuple[str, ...]:
    return tuple(registered_runtimes())


def get_runtime(name: str) -> Runtime:
    """The runtime called ``name``; an unknown name is a :class:`ConfigError` that lists the known ones."""
    runtimes = registered_runtimes()
    if name not in runtimes:
        raise ConfigError(f"unknown runtime '{name}': choose one of {', '.join(runtimes)}")
    return runtimes[name]


def check_runtime_names(names: Iterable[str], where: str = "") -> tuple[str, ...]:
    """``names`` when each is a registered runtime; else one :class:`ConfigError` naming every unknown one
    (``where``: what named them, e.g. ``" in the recipe"``) and the known ones."""
    names = tuple(names)
    runtimes = registered_runtimes()
    unknown = [name for name in names if name not in runtimes]
    if unknown:
        raise ConfigError(f"unknown runtime(s) {', '.join(unknown)}{where}: choose from {', '.join(runtimes)}")
    return names


def available_runtimes(device: torch.device) -> list[str]:
    """Names of the runtimes that run on ``device`` here."""
    return [name for name, runtime in registered_runtimes().items() if runtime.available(device)]


#: What each engine's probe measured in this process, by (engine, device, torch threads): the hardware does not
#: change while a process runs, so a second study (a test suite, a script that searches several models) reads it.
_PROBED: dict[tuple[str, str, int], Mapping[str, Gain | float]] = {}


def declared_probes(names: Iterable[str], device: torch.device) -> tuple[dict[str, EngineProbe], dict[str, str]]:
    """The machine probes the runtimes ``names`` declare on ``device``, one per engine (the first runtime of an
    engine gives it; each runs once per process, device and thread count), and which engine each runtime runs:
    :func:`paretorch.pipeline.core.machine_probe.probe_machine`'s arguments."""
    probes: dict[str, EngineProbe] = {}
    engines: dict[str, str] = {}
    for name in names:
        runtime = get_runtime(name)
        engines[name] = runtime.engine
        if runtime.engine not in probes:
            probes[runtime.engine] = _once((runtime.engine, str(device), torch.get_num_threads()),
                                           runtime.probe(device))
    return probes, engines


def _once(key: tuple[str, str, int], probe: EngineProbe) -> EngineProbe:
    def measured() -> Mapping[str, Gain | float]:
        if key not in _PROBED:
            _PROBED[key] = probe()
        return _PROBED[key]
    return measured


def prepare_runtime(model: nn.Module, name: str, device: torch.device,
                    export: ExportHandle | None = None) -> Callable[..., Tensor]:
    """``model`` (already on ``device``) prepared by the runtime called ``name`` with its ``export`` handle (None:
    outside the engine, :class:`NoExport`); one that does not run on ``device`` here is an
    :class:`InfeasibleConfig`."""
    runtime = get_runtime(name)
    if not runtime.available(device):
        raise InfeasibleConfig(f"runtime {name} is not available on {device.type}")
    return runtime.prepare(model, export if export is not None else NoExport(name), device)
