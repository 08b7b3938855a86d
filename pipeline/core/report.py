"""Human-readable tables of measurements (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from pipeline.core.evaluate import ModelReport


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


def evaluation_table(title: str, report: ModelReport) -> Table:
    """The one-model table printed by ``python -m pipeline evaluate``."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row(report.metric_name, f"{report.metric_value:.4f}")
    for name, value in report.extra.items():
        table.add_row(name, f"{value:.4f}")
    for batch, stats in report.latency.items():
        table.add_row(
            f"latency batch {batch} (p50 / p90)",
            f"{stats.p50_ms:.3f} / {stats.p90_ms:.3f} ms  ({stats.runs} runs, spread {stats.spread_pct:.0f}%)",
        )
    table.add_row("peak memory" + (" (process RSS)" if report.device.startswith("cpu") else ""),
                  format_bytes(report.peak_memory_bytes))
    table.add_row("serialized size", format_bytes(report.size_bytes))
    table.add_row("parameters", format_count(report.params))
    table.add_row("MACs (batch 1)", "not counted (see log)" if report.macs is None else format_count(report.macs))
    table.add_row("runtime", report.runtime)
    if report.compile_seconds:
        table.add_row("compile time (not in latency)", f"{report.compile_seconds:.2f} s")
    table.add_row("device", report.device)
    return table


def print_table(table: Table) -> None:
    Console().print(table)
