"""What a trial measured, carried in its recipe file (``metadata["recorded"]``), so that ``python -m paretorch
apply`` prints its own numbers beside the search's without the study's storage.

The keys are the names :meth:`~paretorch.pipeline.core.evaluate.ModelReport.as_metrics` gives the replay's numbers (the
task metric, ``latency_ms_p50_b<N>``: the trial's own p50, timed alone as ``apply`` times it), so each compares with its
namesake; ``speedup`` is the search's paired speed-up over the baseline (``apply`` times no baseline).
"""

from __future__ import annotations

from collections.abc import Mapping

from paretorch.pipeline.core.evaluate import ModelReport

#: The recipe metadata key.
RECORDED = "recorded"


def recorded(report: ModelReport, metrics: Mapping[str, float], latency_batch: int, device: str
             ) -> dict[str, float | str]:
    """The trial's numbers to carry in its recipe: its metric, its p50 at the objective batch timed alone, its
    paired speed-up and drop (from its ``metrics``) and the device that measured them."""
    numbers: dict[str, float | str] = {"device": device, report.metric_name: report.metric_value}
    if latency_batch in report.latency:
        numbers[latency_key(latency_batch)] = report.latency_p50(latency_batch)
    numbers.update({key: metrics[key] for key in ("metric_drop", "speedup") if key in metrics})
    return numbers


def latency_key(batch: int) -> str:
    """The name of the p50 at ``batch`` (as :meth:`ModelReport.as_metrics` names it)."""
    return f"latency_ms_p50_b{batch}"


def recorded_cells(report: ModelReport, numbers: Mapping[str, float | str]) -> dict[str, str]:
    """The recorded numbers as ``apply``'s table shows them, by its row: ``{"metric": "0.9861", "latency 32":
    "0.207 ms", "speed-up": "5.08x (paired, vs the baseline)", "device": ...}`` (rows without a number are
    left out)."""
    cells: dict[str, str] = {}
    if report.metric_name in numbers:
        cells["metric"] = f"{float(numbers[report.metric_name]):.4f}"
        if "metric_drop" in numbers:
            cells["metric"] += f" (drop {float(numbers['metric_drop']):+.4f})"
    for batch in report.latency:
        if latency_key(batch) in numbers:
            cells[f"latency {batch}"] = f"{float(numbers[latency_key(batch)]):.3f} ms"
    if "speedup" in numbers:
        cells["speed-up"] = f"{float(numbers['speedup']):.2f}x (paired, vs the baseline)"
    if "device" in numbers:
        cells["device"] = str(numbers["device"])
    return cells
