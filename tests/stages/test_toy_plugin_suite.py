"""Plugins cannot break the suite: the stage and runtime contracts, the rule-out searches and the
default-pipeline tests, run again with a third-party stage that has an ``order`` and samples (on/off and
an integer) and a third-party runtime installed (``tests/stages/toy_plugin``, ``tests/plugins/toy_runtime``,
through their entry points, by ``pytest --toy-plugin``: see ``tests/conftest.py``).

The inner run reuses this session's trained digits weights and leaves out the toy stage's
end-to-end ``optimize`` (this session runs it already); its searches make it the longest single test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from torch import nn

REPO = Path(__file__).resolve().parents[2]
#: What the plugin must not turn red: the stage contract and every test that spells out the default pipeline.
WITH_THE_PLUGIN = ["tests/stages/test_stage_contract.py", "tests/pipeline/core/test_runtime_contract.py",
                   "tests/pipeline/search/test_rule_out.py", "tests/pipeline/engine/test_graph.py",
                   "tests/stages/test_distill.py"]
ALREADY_RUN = "tests/stages/test_stage_contract.py::test_toy_stage_runs_through_optimize"


def test_stage_and_default_pipeline_tests_pass_with_a_plugin_stage_installed(
    digits_model: nn.Module, results_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PARETORCH_TEST_WEIGHTS": str(results_dir / "cache" / "weights")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--toy-plugin", "--basetemp",
         str(tmp_path / "basetemp"), "--deselect", ALREADY_RUN, *WITH_THE_PLUGIN],
        capture_output=True, text=True, timeout=1200, env=env, cwd=REPO,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert "toy plugin installed: toy.scale_bias, inference_mode" in run.stdout, "the inner run had the plugin"
    assert " passed" in run.stdout.splitlines()[-1] and " failed" not in run.stdout.splitlines()[-1]
