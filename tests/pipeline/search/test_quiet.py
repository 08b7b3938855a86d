"""Third-party output goes to the study's log file, not the console."""

from __future__ import annotations

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
