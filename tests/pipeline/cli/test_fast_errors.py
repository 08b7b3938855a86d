"""Every user error costs well under a second of CPU: the options, the files and configs they name and the options
that do not fit together are checked before torch is imported.

Each case runs ``python -m paretorch`` in a child process (through :func:`runpy.run_module`, so that the child can
say afterwards which heavy libraries it imported) and measures the child's CPU seconds (``RUSAGE_CHILDREN``), not
wall time: a loaded machine stretches the wall clock, not the work. The bound is generous (1 s; an error found after
torch's import costs 2 to 4 s of CPU), and the child must not have imported torch, Optuna or MLflow at all.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from paretorch.pipeline.cli.main import EXIT_USER_ERROR
from paretorch.pipeline.core.latency import LATENCY_BUDGETS
from paretorch.pipeline.core.names import LATENCY_BUDGET_NAMES, runtime_names
from paretorch.pipeline.core.runtimes.registry import registered_runtimes
from tests.cpu_seconds import children_cpu_seconds

CPU_BOUND_S = 1.0
HEAVY = ("torch", "optuna", "mlflow")
#: ``python -m paretorch ARGS``; afterwards, on standard output, whether each of :data:`HEAVY` was imported.
PROBE = ("import runpy, sys\n"
         "try:\n"
         "    runpy.run_module('paretorch', run_name='__main__', alter_sys=True)\n"
         "finally:\n"
         f"    print(*(name for name in {HEAVY!r} if name in sys.modules))\n")

#: Options argparse or the option checks refuse: the command line, the start of the last stderr line.
BAD_ARGUMENTS = [
    (["optimize", "--model", "digits", "--trials", "abc"], "paretorch optimize: error: argument --trials"),
    (["optimize", "--model", "digits", "--trials", "0"], "error: --trials=0: must be >= 1"),
    (["optimize", "--model", "digits", "--workers", "0"], "error: --workers=0: must be >= 1"),
    (["optimize", "--model", "digits", "--threads", "0"], "error: --threads=0: must be >= 1"),
    (["optimize", "--model", "digits", "--latency-budget", "slow"], "paretorch optimize: error: argument"),
    (["optimize", "--model", "digits", "--runtimes", "eager,onnx"], "error: --runtimes: unknown runtime(s) onnx"),
    (["optimize", "--model", "digits", "--no-such-option"], "paretorch: error: unrecognized arguments"),
    (["evaluate", "--model", "digits", "--runtime", "onnx"], "error: unknown runtime 'onnx'"),
    (["evaluate", "--model", "digits", "--device", "tpu"], "error: unknown device 'tpu'"),
    (["report"], "paretorch report: error: the following arguments are required: --model"),
]

#: Bad files, configs and combinations (the child runs in a folder of :func:`files`): the command line, the start of
#: its one error line, and the words in it that say what to do.
BAD_INPUTS = [
    (["evaluate", "--model", "missing.pt"], "error: model file not found: missing.pt",
     "check the path, or pass a registered model: digits"),
    (["evaluate", "--model", "missing.pt2", "--input-shape", "1x8"], "error: model file not found: missing.pt2",
     "check the path"),
    (["evaluate", "--model", "missing.py:spec"], "error: model file not found: missing.py",
     "check the path before ':'"),
    (["evaluate", "--model", "hf:missing"], "error: hf: directory not found: missing", "pass hf:path/to/a/local"),
    (["evaluate", "--model", "hf:no_config", "--inputs-file", "data.tsv"], "error: hf:no_config has no config.json",
     "point hf: at the directory that holds config.json"),
    (["evaluate", "--model", "digitz"], "error: unknown model 'digitz'", "built-ins are digits"),
    (["evaluate", "--model", "no_such_package.models:spec"], "error: module 'no_such_package.models' not found",
     "is it installed or on PYTHONPATH?"),
    (["evaluate", "--model", "spec.py"], "error: model 'spec.py' names a file but no attribute",
     "use 'spec.py:<attr>'"),
    (["evaluate", "--model", "digits", "--eval-data", "missing.tsv"], "error: --eval-data missing.tsv: no such file",
     "a .tsv/.csv/.jsonl table, a .pt file or a BEIR retrieval directory"),
    (["evaluate", "--model", "digits", "--eval-data", "data.xlsx"], "error: --eval-data data.xlsx: unknown format",
     "use .tsv, .csv or .jsonl"),
    (["evaluate", "--model", "model.pt", "--inputs-file", "missing.pt"], "error: inputs file not found: missing.pt",
     "pass a .pt file saved with torch.save"),
    (["evaluate", "--model", "hf:hf", "--inputs-file", "missing.txt"], "error: inputs file not found: missing.txt",
     "pass a UTF-8 text file with one input per line"),
    (["evaluate", "--model", "model.pt", "--input-shape", "1x8", "--inputs-file", "inputs.pt"],
     "error: give either --input-shape or --inputs-file, not both", "either"),
    (["evaluate", "--model", "digits", "--input-shape", "1x8"], "error: --input-shape: only for TorchScript",
     "a Python spec brings its own data"),
    (["evaluate", "--model", "hf:hf", "--input-shape", "1x8"], "error: --input-shape does not apply to hf: models",
     "pass --inputs-file"),
    (["evaluate", "--model", "model.pt", "--eval-data", "data.tsv"], "error: --eval-data data.tsv holds text",
     "pass a .pt file"),
    (["evaluate", "--model", "model.pt"], "error: TorchScript file model.pt carries no input data",
     "pass --input-shape"),
    (["evaluate", "--model", "hf:hf"], "error: hf:hf needs --inputs-file", "or --eval-data"),
    (["apply", "--model", "digits", "--recipe", "missing.json"], "error: recipe file not found: missing.json",
     "--recipe takes a recipe JSON file"),
    (["optimize", "--model", "digits", "--enqueue", "missing.json"], "error: recipe file not found: missing.json",
     "--enqueue takes a recipe JSON file"),
    (["optimize", "--model", "digits", "--search-config", "missing.yaml"], "error: search config not found",
     "pass the path of a YAML file"),
    (["optimize", "--model", "digits", "--search-config", "broken.yaml"], "error: broken.yaml: not valid YAML (line 2",
     "fix the file or pass another --search-config"),
    (["report", "--model", "digits", "--search-config", "unknown_key.yaml"],
     "error: invalid search config (unknown_key.yaml): samplr='tpe': Extra inputs are not permitted", "fix "),
    (["optimize", "--model", "digits", "--search-config", "bad_value.yaml"],
     "error: invalid search config (bad_value.yaml): sampler='best'", "Input should be 'tpe', 'nsga2' or 'random'"),
    (["optimize", "--model", "digits", "--search-config", "a_list.yaml"], "error: a_list.yaml: a search config is a "
     "mapping of fields", "pipeline: ..."),
    (["optimize", "--model", "digits", "--max-drop", "abc"], "error: --max-drop abc: not a number",
     "give an absolute drop"),
    (["optimize", "--model", "digits", "--tail-limit", "most"], "error: --tail-limit:", "give one such as 1% or 0.02"),
    (["optimize", "--model", "digits", "--objectives", "metric,speed"], "error: --objectives:",
     "Input should be 'metric', 'latency' or 'size'"),
    (["optimize", "--model", "digits", "--pipeline", "missing"], "error: pipeline 'missing' not found",
     "use 'default', a YAML path, or one of"),
    (["optimize", "--model", "digits", "--pipeline", "broken.yaml"], "error: broken.yaml: not valid YAML",
     "fix the file or pass another --pipeline"),
    (["optimize", "--model", "digits", "--storage", "runs/optuna.db"], "error: --storage runs/optuna.db: not a "
     "storage URL", "use sqlite:///PATH"),
    (["optimize", "--model", "digits", "--tracking-uri", "ftp://host"], "error: --tracking-uri ftp://host: not an "
     "MLflow store", "or pass --no-tracking"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the files the bad inputs name: a model file, an inputs file, a text table, a spreadsheet, an
    ``hf:`` directory and one without its config.json, a Python file and search configs (broken YAML, an unknown
    key, a bad value, a list)."""
    folder = tmp_path_factory.mktemp("bad-inputs")
    for name, text in {"model.pt": "", "inputs.pt": "", "spec.py": "", "data.tsv": "text\tlabel\na\t0\nb\t1\n",
                       "data.xlsx": "", "broken.yaml": "max_drop: [0.01\n", "unknown_key.yaml": "samplr: tpe\n",
                       "bad_value.yaml": "sampler: best\n", "a_list.yaml": "- sampler: tpe\n"}.items():
        (folder / name).write_text(text)
    (folder / "hf").mkdir()
    (folder / "hf" / "config.json").write_text("{}")
    (folder / "no_config").mkdir()
    return folder


def run_probe(argv: list[str], cwd: Path | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    """``python -m paretorch ARGV`` in a child process, and the child's CPU seconds."""
    before = children_cpu_seconds()
    result = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120,
                            cwd=cwd)
    return result, children_cpu_seconds() - before


def assert_a_cheap_user_error(argv: list[str], result: subprocess.CompletedProcess[str], cpu: float) -> None:
    """The user-error exit, none of :data:`HEAVY` imported, under :data:`CPU_BOUND_S` of CPU."""
    assert result.returncode == EXIT_USER_ERROR, result.stderr
    assert result.stdout.split() == [], f"imported {result.stdout.split()} before the error"
    assert cpu < CPU_BOUND_S, f"{' '.join(argv)}: {cpu:.2f} s of CPU before the error"


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_an_argument_error_costs_under_a_second_of_cpu(argv: list[str], message: str) -> None:
    result, cpu = run_probe(argv)
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr
    assert "Traceback" not in result.stderr
    assert_a_cheap_user_error(argv, result, cpu)


@pytest.mark.parametrize(("argv", "message", "to_do"), BAD_INPUTS,
                         ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_bad_file_config_or_combination_is_one_line_before_torch(argv: list[str], message: str, to_do: str,
                                                                   files: Path) -> None:
    result, cpu = run_probe(argv, cwd=files)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert to_do in lines[0], lines[0]
    assert_a_cheap_user_error(argv, result, cpu)


def test_the_names_checked_before_torch_are_the_registered_ones() -> None:
    assert tuple(registered_runtimes()) == runtime_names()
    assert tuple(LATENCY_BUDGETS) == LATENCY_BUDGET_NAMES
