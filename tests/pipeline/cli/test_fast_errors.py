"""Argument errors cost well under a second: the command line is parsed and checked before torch loads.

CPU seconds of the child process (``RUSAGE_CHILDREN``), not wall time: a loaded machine
stretches the wall clock, not the work. The bound is generous (1 s; a check that imports
torch takes 3 to 6 s of CPU); the structural test checks that torch is not imported at all.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from paretorch.pipeline.cli.main import EXIT_USER_ERROR
from paretorch.pipeline.core.latency import LATENCY_BUDGETS
from paretorch.pipeline.core.names import LATENCY_BUDGET_NAMES, runtime_names
from paretorch.pipeline.core.runtimes.registry import registered_runtimes
from tests.cpu_seconds import children_cpu_seconds

#: Each argument error a user can make, and the start of its last stderr line.
BAD_ARGUMENTS = [
    (["optimize", "--model", "digits", "--trials", "abc"], "python -m paretorch optimize: error: argument --trials"),
    (["optimize", "--model", "digits", "--trials", "0"], "error: --trials=0: must be >= 1"),
    (["optimize", "--model", "digits", "--workers", "0"], "error: --workers=0: must be >= 1"),
    (["optimize", "--model", "digits", "--threads", "0"], "error: --threads=0: must be >= 1"),
    (["optimize", "--model", "digits", "--latency-budget", "slow"], "python -m paretorch optimize: error: argument"),
    (["optimize", "--model", "digits", "--runtimes", "eager,onnx"], "error: --runtimes: unknown runtime(s) onnx"),
    (["optimize", "--model", "digitz"], "error: unknown model 'digitz'"),
    (["optimize", "--model", "digits", "--no-such-option"], "python -m paretorch: error: unrecognized arguments"),
    (["evaluate", "--model", "digits", "--runtime", "onnx"], "error: unknown runtime 'onnx'"),
    (["evaluate", "--model", "digits", "--device", "tpu"], "error: unknown device 'tpu'"),
    (["apply", "--model", "digits", "--recipe", "/nonexistent/recipe.json"], "error: recipe file not found"),
    (["report"], "python -m paretorch report: error: the following arguments are required: --model"),
]
CPU_BOUND_S = 1.0


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_an_argument_error_costs_under_a_second_of_cpu(argv: list[str], message: str) -> None:
    before = children_cpu_seconds()
    result = subprocess.run([sys.executable, "-m", "paretorch", *argv], capture_output=True, text=True, timeout=120)
    cpu = children_cpu_seconds() - before
    assert result.returncode == EXIT_USER_ERROR, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr
    assert "Traceback" not in result.stderr
    assert cpu < CPU_BOUND_S, f"{' '.join(argv)}: {cpu:.2f} s of CPU before the error"


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS[:3])
def test_an_argument_error_imports_no_torch(argv: list[str], message: str) -> None:
    probe = ("import sys; from paretorch.pipeline.cli.main import main; code = main(sys.argv[1:]); "
             "print('torch' in sys.modules, 'optuna' in sys.modules, 'mlflow' in sys.modules, code)")
    result = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
    if result.returncode:  # argparse's own errors exit before the print
        assert result.returncode == EXIT_USER_ERROR and message in result.stderr
        return
    assert result.stdout.split() == ["False", "False", "False", str(EXIT_USER_ERROR)], result.stdout + result.stderr


def test_the_names_checked_before_torch_are_the_registered_ones() -> None:
    assert tuple(registered_runtimes()) == runtime_names()
    assert tuple(LATENCY_BUDGETS) == LATENCY_BUDGET_NAMES
