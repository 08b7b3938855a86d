"""Third-party output goes to the study's log file, not the console."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paretorch.pipeline.search.quiet import stderr_to


def test_stderr_of_python_c_and_subprocesses_goes_to_the_log(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "study" / "third-party.log"
    with stderr_to(log):
        print("python stderr", file=sys.stderr)
        os.write(2, b"fd 2, as a C extension writes\n")
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('child stderr\\n')"], check=True)
        print("console line")
    print("after", file=sys.stderr)
    captured = capfd.readouterr()
    assert log.read_text().splitlines() == ["python stderr", "fd 2, as a C extension writes", "child stderr"]
    assert captured.out == "console line\n" and captured.err == "after\n"


def test_a_logging_handler_made_in_the_block_writes_to_the_console_after_it(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """As ``logging.warning`` makes one on a root logger without handlers (ONNX Runtime's quantizer, after a search):
    left on the closed log, every later record printed a "Logging error" traceback."""
    logger = logging.getLogger("paretorch-test-third-party")
    log = tmp_path / "third-party.log"
    with stderr_to(log):
        handler = logging.StreamHandler()  # bound to the standard error of the moment: the log
        logger.addHandler(handler)
        logger.warning("inside")
        handler.flush()
        assert log.read_text() == "inside\n"
    try:
        logger.warning("after")
        captured = capfd.readouterr()
        assert captured.err == "after\n" and "Logging error" not in captured.err
    finally:
        logger.removeHandler(handler)
