"""The CLI as a user meets it: help, one-line errors with exit code 2, the evaluate table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from paretorch.pipeline.cli.main import EXIT_USER_ERROR, main


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paretorch", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_help_lists_commands() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    assert "evaluate" in result.stdout and "Optimize trained PyTorch models" in result.stdout


def test_evaluate_help_explains_model_forms(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "path/file.py:attr" in out and "--device" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["evaluate", "--model", "nosuch"], "error: unknown model 'nosuch'"),
        (["evaluate", "--model", "/nonexistent/model.py:spec"], "error: model file not found"),
        (["evaluate", "--model", "digits", "--device", "tpu"], "error: unknown device 'tpu'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1  # one line, no traceback


def test_absent_device_subprocess_has_no_traceback() -> None:
    result = run_cli("evaluate", "--model", "digits", "--device", "cuda")
    if result.returncode == 0:  # a machine with CUDA
        return
    assert result.returncode == EXIT_USER_ERROR
    assert "Traceback" not in result.stderr
    assert "error: device 'cuda' is not available here" in result.stderr


def test_evaluate_prints_table(results_dir: Path, digits_model: object) -> None:
    # digits_model has trained and cached the weights in results_dir already
    result = run_cli("evaluate", "--model", "digits", "--results-dir", str(results_dir))
    assert result.returncode == 0, result.stderr
    for row in ("accuracy", "latency batch 1", "latency batch 32", "serialized size", "MACs"):
        assert row in result.stdout
    assert list((results_dir / "cache" / "weights").glob("digits-*.pt"))
