"""The MLX plugin held to paretorch's stage and runtime contracts, as this package's own CI runs them:
``python -m pytest`` in plugins/mlx with the package installed (paretorch's suite does it from a copy outside its
checkout, tests/plugins/test_out_of_tree.py)."""

from __future__ import annotations

from paretorch.testing import RuntimeContract, StageContract


class TestMLXRuntime(RuntimeContract):
    runtime_name = "mlx"


class TestMLXExport(StageContract):
    stage_name = "export.mlx"
