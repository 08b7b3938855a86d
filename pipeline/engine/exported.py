"""File runtimes in the runner (``onnxruntime``, ``openvino``): the files' open sessions and their reports."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable

from pipeline.core.evaluate import ModelReport
from pipeline.core.runtimes.base import LoadedModel
from pipeline.core.stage import ExportResult

#: Sessions of exported runtimes kept open (least recently used closed first): each holds its model's weights.
OPEN_SESSIONS = 4


class OpenSessions:
    """Sessions of exported files by export key: at most ``limit`` open, the least recently used dropped."""

    def __init__(self, limit: int = OPEN_SESSIONS) -> None:
        self.limit = limit
        self._open: OrderedDict[str, LoadedModel] = OrderedDict()

    def get(self, key: str, open_file: Callable[[], LoadedModel]) -> tuple[LoadedModel, bool]:
        """The session of ``key``, opened with ``open_file`` when it is not open; and whether it was opened now."""
        if key in self._open:
            self._open.move_to_end(key)
            return self._open[key], False
        session = self._open[key] = open_file()
        while len(self._open) > self.limit:
            self._open.popitem(last=False)
        return session, True


def exported_report(report: ModelReport, export: ExportResult, session: LoadedModel) -> ModelReport:
    """An exported runtime's report: the file's size, the session's settings and creation seconds."""
    device = f"{report.device}; {session.describe()}"
    return dataclasses.replace(report, size_bytes=export.size_bytes, device=device,
                               extra={**report.extra, "runtime_session_seconds": session.creation_seconds})
