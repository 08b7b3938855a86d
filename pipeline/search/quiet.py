"""Third-party chatter off the console: while a study runs, everything written to the process's
standard error (torchao's ``.so`` load failures, coremltools' version warnings and MIL progress
bars, inductor and ONNX exporter warnings, Python warnings, Optuna's failed-trial tracebacks)
goes to a per-study log file. The console (standard output) keeps one line per trial and the
progress bar. A logging handler made during the block (``logging.warning`` with no handler configured makes one on
the root logger, as ONNX Runtime's quantizer does) writes to the console's standard error again after it: left on the
closed log file, each later record printed "--- Logging error --- ... I/O operation on closed file"."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[Path]:
    """Point file descriptor 2 (and ``sys.stderr``) at ``path`` (appended) until the block ends,
    so C extensions and subprocesses are captured too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with path.open("a", buffering=1) as log:
            os.dup2(log.fileno(), 2)
            previous, sys.stderr = sys.stderr, log  # also when sys.stderr is not fd 2 (e.g. under pytest)
            try:
                yield path
            finally:
                log.flush()
                sys.stderr = previous
                os.dup2(saved, 2)
                _repoint_handlers(log, previous)
    finally:
        os.close(saved)


def _repoint_handlers(old: object, new: TextIO) -> None:
    """Every logger's stream handler that writes to ``old`` writes to ``new`` from now on."""
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is old:
                handler.setStream(new)
