"""Human-readable tables of measurements (rich)."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

from paretorch.pipeline.core.evaluate import ModelReport
from paretorch.pipeline.core.word_table import WordTable


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def evaluation_table(title: str, report: ModelReport, beside: Mapping[str, str] | None = None,
                     beside_label: str = "") -> Table:
    """The one-model table printed by ``python -m paretorch evaluate`` and ``apply``. ``beside``: a third column,
    ``beside_label``, with other numbers of the same measures (``apply``: what the search recorded), keyed
    ``metric``, ``latency <batch>``, ``speed-up`` and ``device``."""
    rows: list[tuple[str, str, str]] = [("metric", report.metric_name, f"{report.metric_value:.4f}")]
    rows.extend((name, name, f"{value:.4f}") for name, value in report.extra.items())
    for batch, stats in report.latency.items():
        timing = f"{stats.p50_ms:.3f} / {stats.p90_ms:.3f} ms  ({stats.runs} runs, spread {stats.spread_pct:.0f}%)"
        rows.append((f"latency {batch}", f"latency batch {batch} (p50 / p90)", timing))
    if beside is not None and "speed-up" in beside:
        rows.append(("speed-up", "speed-up", "-"))
    rows.append(("memory", "peak memory" + (" (process RSS)" if report.device.startswith("cpu") else ""),
                 format_bytes(report.peak_memory_bytes)))
    rows.append(("size", "serialized size", format_bytes(report.size_bytes)))
    rows.append(("params", "parameters", format_count(report.params)))
    macs = "not counted (see log)" if report.macs is None else format_count(report.macs)
    rows.append(("macs", "MACs (batch 1)", macs))
    rows.append(("runtime", "runtime", report.runtime))
    if report.compile_seconds:
        rows.append(("compile", "compile time (not in latency)", f"{report.compile_seconds:.2f} s"))
    rows.append(("device", "device", report.device))
    table = WordTable(title=title, header_style="bold")
    table.add_column("measure")
    table.add_column("value" if beside is None else "this run", justify="right")
    if beside is not None:
        table.add_column(beside_label, justify="right")
    for key, measure, value in rows:
        table.add_row(measure, value, *([beside.get(key, "")] if beside is not None else []))
    return table


def print_table(table: Table) -> None:
    Console().print(table)
