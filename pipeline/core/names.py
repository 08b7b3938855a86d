"""The names a user types on the command line, checked without torch.

``python -m paretorch`` parses and checks its arguments before it imports torch (seconds of CPU),
so a typo costs well under a second. The modules that act on these names (the device table, the
runtime registry, the latency settings, the model resolver) import them from here; the tests check
that the registries hold exactly these names.
"""

from __future__ import annotations

import importlib.metadata

from paretorch.pipeline.core.errors import ConfigError, DeviceError, SpecError

DEVICE_CHOICES = ("auto", "mps", "cuda", "cpu")
#: Order in which ``auto`` picks a device.
AUTO_ORDER = ("mps", "cuda", "cpu")
#: Entry-point group through which packages declare their runtimes (:mod:`paretorch.pipeline.core.runtimes.registry`).
RUNTIME_ENTRY_POINT_GROUP = "paretorch.runtimes"
#: The console's order for the built-in runtimes (a plugin's runtimes follow, by name).
BUILT_IN_RUNTIMES = ("eager", "compile", "compile_dynamic", "compile_cudagraphs", "onnxruntime", "openvino")
#: The runtime of the baseline, of a recipe that names none and of a runtime-free measurement (the screen, the
#: subset, the reference outputs): the torch module as it is, the reference every other runtime is there to beat.
DEFAULT_RUNTIME = "eager"
#: ``--runtimes all``: every runtime available on the device.
ALL = "all"
#: The settings of :data:`paretorch.pipeline.core.latency.LATENCY_BUDGETS` (``--latency-budget``).
LATENCY_BUDGET_NAMES = ("quick", "normal", "thorough")
#: The budget of a user who chose none (``--latency-budget`` unset; scripted use, ``evaluate``).
DEFAULT_LATENCY_BUDGET = "normal"
#: How a model can be used, each timed its own way (``--workload``, :mod:`paretorch.pipeline.core.workload`); the first
#: is the default.
WORKLOADS = ("serve", "corpus", "model")
#: Entry-point group through which packages declare model specs by name
#: (``[project.entry-points."paretorch.models"] name = "module:attr"``, a ModelSpec or a function returning one).
MODEL_ENTRY_POINT_GROUP = "paretorch.models"
#: Go on when the unoptimized model scores differently twice (:mod:`paretorch.pipeline.core.self_check`).
ALLOW_FLAG = "--allow-nondeterministic"
#: The hidden option that makes a process one worker of a study its parent prepared
#: (:mod:`paretorch.pipeline.search.workers`).
WORKER_FLAG = "--worker-index"


def device_name(name: str) -> str:
    """``name`` lower-cased when it is one of :data:`DEVICE_CHOICES`; else a :class:`DeviceError`."""
    name = name.strip().lower()
    if name not in DEVICE_CHOICES:
        raise DeviceError(f"unknown device '{name}': choose one of {', '.join(DEVICE_CHOICES)}")
    return name


def runtime_names() -> tuple[str, ...]:
    """The installed runtimes' names, read from their entry points (no runtime module imported): the built-ins in
    the console's order, then the plugins' by name."""
    names = {ep.name for ep in importlib.metadata.entry_points(group=RUNTIME_ENTRY_POINT_GROUP)}
    order = {name: i for i, name in enumerate(BUILT_IN_RUNTIMES)}
    return tuple(sorted(names, key=lambda name: (order.get(name, len(order)), name)))


def unknown_runtime(name: str) -> ConfigError:
    """The error of a runtime name that is not registered."""
    return ConfigError(f"unknown runtime '{name}': choose one of {', '.join(runtime_names())}")


def unknown_runtimes(names: tuple[str, ...] | list[str]) -> str | None:
    """What is wrong with a list of runtime names (``--runtimes``; ``all`` alone is every available one), None
    when every one is registered."""
    if tuple(names) == (ALL,):
        return None
    known = runtime_names()
    unknown = [name for name in names if name not in known]
    return f"unknown runtime(s) {', '.join(unknown)}: choose from {', '.join(known)}" if unknown else None


def model_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The registered model names (the ``paretorch.models`` entry points), by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=MODEL_ENTRY_POINT_GROUP)}


def builtin_names() -> list[str]:
    """Names of the registered model specs (``MODEL=digits``), sorted."""
    return sorted(model_entry_points())


def unknown_model(ref: str) -> SpecError:
    """The error of a ``--model`` that is neither a registered name nor a file or module reference."""
    return SpecError(f"unknown model '{ref}': built-ins are {', '.join(builtin_names())}; "
                     "or pass path/to/file.py:attr or package.module:attr")
