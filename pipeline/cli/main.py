"""``python -m paretorch``: the command-line interface.

The command line is parsed and checked (:mod:`paretorch.pipeline.cli.parser`), then the files, configs and stores it
names (:mod:`paretorch.pipeline.cli.checks`), before torch is imported: such an error costs a fraction of a second
of CPU. Every :class:`PipelineError` is printed as one
``error:`` line with exit code 2; nothing the user mistyped produces a traceback.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from paretorch.pipeline.cli.checks import check_inputs
from paretorch.pipeline.cli.parser import build_parser, check_args, parse_args
from paretorch.pipeline.core.errors import PipelineError
from paretorch.pipeline.core.paths import set_results_dir
from paretorch.pipeline.core.secrets import mask_secrets

EXIT_USER_ERROR = 2

__all__ = ["EXIT_USER_ERROR", "build_parser", "main", "run"]


def run(argv: Sequence[str] | None = None, started: float | None = None) -> NoReturn:
    """``python -m paretorch``: :func:`main`, then exit at once. The interpreter's last garbage collection walks
    every object that torch, MLflow and Optuna made (2 to 3 s on a loaded machine, after the last line is
    printed and everything is recorded); frozen, they are left to the operating system (atexit handlers still run)."""
    code = main(argv, started)
    sys.stdout.flush()
    gc.freeze()
    sys.exit(code)


#: Loggers that warn about optional kernels they cannot load on this machine (torchao's ``_C_mxfp8`` / CUDA ``.so``
#: files on a CPU-only or other-Python install): nothing a command uses, so not the console's business.
OPTIONAL_KERNEL_LOGGERS = ("torchao",)


#: torch's pytree logger and the note it writes for each Enum that torchao registers at import (a deprecation in
#: torchao's code, not the user's): dropped; the logger's other warnings still show.
ENUM_CONSTANT_NOTE = ("torch.utils._pytree", "Calling register_constant() on Enum subclasses is deprecated")


def _not_enum_constant_note(record: logging.LogRecord) -> bool:
    return ENUM_CONSTANT_NOTE[1] not in record.getMessage()


def quiet_optional_kernels() -> None:
    """Raise :data:`OPTIONAL_KERNEL_LOGGERS` to errors only, and drop :data:`ENUM_CONSTANT_NOTE`, before anything
    imports them (the ``hf:`` path imports torchao while resolving the model, before a study points standard error
    at its third-party log)."""
    for name in OPTIONAL_KERNEL_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    pytree = logging.getLogger(ENUM_CONSTANT_NOTE[0])
    if _not_enum_constant_note not in pytree.filters:
        pytree.addFilter(_not_enum_constant_note)


def main(argv: Sequence[str] | None = None, started: float | None = None) -> int:
    """Run one command; ``started``: its ``time.perf_counter()`` start (default: now), for its ``time:`` line."""
    started = time.perf_counter() if started is None else started
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what worker processes are started with
    args.started = started
    try:
        check_args(args)
        if getattr(args, "results_dir", None):
            set_results_dir(args.results_dir)
        check_inputs(args)  # files, configs, stores, options together: still no torch
        quiet_optional_kernels()
        # Imported only now, with the command line checked: it loads torch, Optuna and MLflow (seconds of CPU).
        from paretorch.pipeline.cli.commands import COMMANDS

        return COMMANDS[args.command](args)
    except PipelineError as exc:
        print(f"error: {mask_secrets(str(exc))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
