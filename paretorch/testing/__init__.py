"""The contract tests a plugin runs in its own CI, as Optuna's ``optuna.testing`` ships its own: pytest test classes
to subclass, one per kind of plugin, each naming what it tests.

::

    # tests/test_contract.py of a plugin package
    from paretorch.testing import RuntimeContract, StageContract

    class TestScaleBias(StageContract):
        stage_name = "toy.scale_bias"           # the stage's entry-point name

    class TestInferenceMode(RuntimeContract):
        runtime_name = "inference_mode"          # the runtime's entry-point name

``python -m pytest`` then runs every check of each contract on the installed plugin (found through its entry
points, as the search finds it), on the CPU, over the built-in digits model (:mod:`.digits`: trained once, cached
under ``PARETORCH_RESULTS_DIR``). paretorch's own suite runs the same classes over every built-in stage and runtime.

This package imports pytest, a development dependency (``pip install pytest``), never a runtime one: nothing but
tests imports it. The plugin's own code imports :mod:`paretorch.extend`.
"""

from __future__ import annotations

import pytest

# The contracts' own asserts say what failed (pytest rewrites test modules only, unless told).
pytest.register_assert_rewrite("paretorch.testing.stage_contract", "paretorch.testing.runtime_contract")

from paretorch.testing.runtime_contract import RuntimeContract  # noqa: E402 (after the rewrite is registered)
from paretorch.testing.stage_contract import StageContract  # noqa: E402

__all__ = ["RuntimeContract", "StageContract"]
