"""BENCHMARKS.md rendering: speed-ups against the baseline row, the search row against
the best single technique within the allowed drop, and the baseline's drift."""

from __future__ import annotations

from typing import Any

from experiments.bench.harness import render_table


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
