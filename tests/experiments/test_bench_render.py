"""BENCHMARKS.md rendering: speed-ups against the baseline row, the search row against
the best single technique within the allowed drop, and the baseline's drift."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paretorch.experiments.bench.recovery import RECOVERY_PREFIX
from paretorch.experiments.bench.render import render_markdown, render_table


def _row(name: str, kind: str, ms: float, drop: float = 0.0) -> dict[str, Any]:
    return {"name": name, "kind": kind, "recipe": name, "metric": 1.0 - drop, "drop": drop,
            "latency_ms_p50": {"1": ms, "32": 10 * ms}, "latency_ms_p90": {"1": ms}, "size_bytes": 2048,
            "compile_seconds": 0.0, "note": ""}


def _result(**extra: Any) -> dict[str, Any]:
    rows = [_row("fp32 eager (baseline)", "baseline", 4.0), _row("compile", "single", 2.0),
            _row("int8", "single", 0.5, drop=0.05),  # faster, but over the allowed drop
            _row("search best (30 trials)", "search", 1.0)]
    return {"model": "m", "device": "cuda (test)", "objective_batch": 1, "metric": "accuracy", "torch": "x",
            "date": "today", "max_drop": 0.01, "latency_settings": {"min_runs": 50, "min_seconds": 1.0},
            "rows": rows, **extra}


def test_speed_ups_and_the_search_against_the_best_single_within_the_drop() -> None:
    table = render_table(_result())
    assert "| 4.000 | 1.00x |" in table and "| 2.000 | 2.00x |" in table and "| 0.500 | 8.00x |" in table
    # int8 is faster but 5 % worse: the search is compared with compile, not with it
    assert "2.00x vs best single (compile)" in table
    assert "Drift" not in table


def test_the_baseline_re_measured_last_is_shown_beside_the_first() -> None:
    table = render_table(_result(baseline_recheck_ms_p50={"1": 3.5, "32": 35.0}))
    assert "measured again after the search: 3.500 ms at batch 1 (first: 4.000 ms)" in table


def test_a_search_that_lands_on_a_single_technique_says_so() -> None:
    result = _result()
    result["rows"][-1]["recipe"] = "compile"  # the search's best is the compile row's recipe
    table = render_table(result)
    assert "the same recipe as the 'compile' row: the search found nothing faster" in table
    assert "vs best single" not in table


def test_recovery_files_get_their_own_table_not_a_benchmark_table(tmp_path: Path) -> None:
    (tmp_path / "m-cuda.json").write_text(json.dumps(_result()))
    prune = {"stage": "prune", "method": "structured", "ratio": 0.25, "head_ratio": 0.0, "ffn_ratio": 0.25}
    rows = [{"prune": prune, "steps": 0, "lr": 1e-4, "metric": 0.65, "drop": 0.35, "seconds": 0.0},
            {"prune": prune, "steps": 300, "lr": 1e-4, "hidden_layers": 6, "metric": 0.88, "drop": 0.12,
             "seconds": 11.3}]
    recovery = {"model": "m", "device": "cuda", "metric": "agreement", "baseline": 1.0, "batch_size": 32,
                "rows": rows}
    (tmp_path / f"{RECOVERY_PREFIX}m-cuda.json").write_text(json.dumps(recovery))
    text = render_markdown(tmp_path)
    assert text.count("### m on cuda (test)") == 1
    assert "### Recovery by distillation: m on cuda" in text
    assert "| FFN 0.25 | 0 | - | 0 | 0.6500 | +0.3500 | 0.0 |" in text
    assert "| FFN 0.25 | 300 | 0.0001 | 6 | 0.8800 | +0.1200 | 11.3 |" in text
