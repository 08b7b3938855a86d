"""A runtime's export in the runner: the lazy handle a runtime is prepared with, what runtimes opened from their
files (kept per file), and the report of a model measured from its file."""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from torch import Tensor

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.evaluate import ModelReport
from paretorch.pipeline.core.runtimes.base import LoadedModel
from paretorch.pipeline.core.stage import ExportResult, StageConfig
from paretorch.pipeline.engine.run_result import NodeResult

#: Prepared functions of runtimes that read their export kept open (least recently used closed first): each
#: holds its model's weights.
OPEN_SESSIONS = 4


class LazyExport:
    """The export a runtime declares of one model (:class:`paretorch.pipeline.core.runtimes.base.ExportHandle`): made
    through the runner's export cache the first time the runtime asks for it; ``seconds`` that took."""

    def __init__(self, runtime: str, config: StageConfig | None = None, key: str | None = None,
                 make: Callable[[], NodeResult] | None = None) -> None:
        self.runtime = runtime
        #: The export's config (None: the runtime declares no export) and its cache key.
        self.config = config
        self.key = key
        self._make = make
        self._result: ExportResult | None = None
        #: The export's config as its stage resolved it (an ``auto`` decided), once made.
        self.resolved: StageConfig | None = None
        self.seconds = 0.0

    @property
    def used(self) -> bool:
        """Whether the runtime read its export."""
        return self._result is not None

    def result(self) -> ExportResult:
        if self._make is None:
            raise ConfigError(f"runtime {self.runtime} declares no export (Runtime.export) and cannot read one")
        if self._result is None:
            start = time.perf_counter()
            made = self._make()
            self._result, self.resolved = made.value, made.resolved
            self.seconds = time.perf_counter() - start
        return self._result


class OpenSessions:
    """What runtimes opened from their export files, by (runtime, export key): at most ``limit`` kept, the least
    recently used dropped."""

    def __init__(self, limit: int = OPEN_SESSIONS) -> None:
        self.limit = limit
        self._open: OrderedDict[Hashable, Callable[..., Tensor]] = OrderedDict()

    def kept(self, key: Hashable) -> Callable[..., Tensor] | None:
        """The function kept under ``key`` (None: none)."""
        if key not in self._open:
            return None
        self._open.move_to_end(key)
        return self._open[key]

    def keep(self, key: Hashable, fn: Callable[..., Tensor]) -> None:
        self._open[key] = fn
        while len(self._open) > self.limit:
            self._open.popitem(last=False)


def exported_report(report: ModelReport, export: ExportResult, fn: Callable[..., Tensor],
                    session_seconds: float) -> ModelReport:
    """The report of a model measured from its export file: the file's size, the settings the runtime opened it
    with (:meth:`LoadedModel.describe`) and the seconds opening it took (0: kept open from before)."""
    device = f"{report.device}; {fn.describe()}" if isinstance(fn, LoadedModel) else report.device
    return dataclasses.replace(report, size_bytes=export.size_bytes, device=device,
                               extra={**report.extra, "runtime_session_seconds": session_seconds})
