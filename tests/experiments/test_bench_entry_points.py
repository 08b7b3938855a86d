"""Every bench command starts: each module imported first, in a fresh interpreter (an import cycle between the
row modules and the harness shows only in the order a command imports them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMANDS = tuple(f"paretorch.experiments.bench{name}" for name in (
    "", ".ort_rows", ".gpu_rows", ".peers", ".pack_agreement", ".pack_b1_ab", ".one_liners"))


@pytest.mark.parametrize("module", COMMANDS)
def test_the_bench_command_starts(module: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
