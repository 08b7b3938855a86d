"""BENCHMARKS.md renders every result file: each prefix has its section, and a file without one is a search table."""

from __future__ import annotations

import json
from pathlib import Path

from paretorch.experiments.bench.paths import RESULTS_DIR
from paretorch.experiments.bench.render import SECTIONS, render_markdown


def test_every_result_file_in_the_repository_renders() -> None:
    text = render_markdown(RESULTS_DIR)
    assert text.startswith("# Benchmarks")
    for path in sorted(RESULTS_DIR.glob("*.json")):
        if not path.name.startswith(tuple(prefix for prefix, _ in SECTIONS)):
            assert "objective_batch" in json.loads(path.read_text()), f"{path.name}: no section renders it"


def test_the_mlx_gpu_rows_render_with_their_parity(tmp_path: Path) -> None:
    row = {"model": "digits", "batch": 1, "max_abs_err": 3.8e-6, "cosine": 0.99999994, "torch_eager_cuda_ms": 0.325,
           "mlx_cuda_from_torch_ms": 0.75, "mlx_cuda_arrays_ms": 0.324}
    (tmp_path / "mlx-cuda-h200.json").write_text(json.dumps({"what": "MLX vs torch", "device": "H200",
                                                             "date": "2026-11-28", "rows": [row]}))
    text = render_markdown(tmp_path)
    assert "### MLX on H200 (2026-11-28)" in text and "| digits | 1 | 0.325 | 0.750 | 0.324 | 3.8e-06 |" in text


def test_the_probe_stability_runs_render_their_orders() -> None:
    """Both probe runs kept in the repository (CPU and H200) render, with how many preset orders they gave."""
    text = render_markdown(RESULTS_DIR)
    for name in ("probe-stability-cpu.json", "probe-stability-cuda.json"):
        result = json.loads((RESULTS_DIR / name).read_text())
        assert f"**{result['distinct_orders']} distinct preset order(s)**" in text
    assert "### The machine probe, 10 times on NVIDIA H200" in text
