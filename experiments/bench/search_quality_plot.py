"""The search-quality PNG: hypervolume against trials per run (left), the fronts in the same scale (right)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from paretorch.experiments.bench.hypervolume import FrontPoint, VolumeAnalysis

#: Speed-ups labelled on the fronts' log axis.
SPEEDUP_TICKS = (0.5, 1, 1.5, 2, 3, 5, 7, 10, 15, 20, 30, 50, 100)


def _staircase(rows: Sequence[FrontPoint]) -> tuple[list[float], list[float]]:
    """The front as a step line (speed-up, share of the allowed drop used), fastest last."""
    points = sorted((r["speedup"], min(max(r["drop_share"], 0.0), 1.0)) for r in rows)
    return [x for x, _ in points], [y for _, y in points]


def save_figure(result: VolumeAnalysis, subject: str, path: Path) -> None:
    """Write the figure of a :func:`paretorch.experiments.bench.search_quality.analyse` result as a PNG, titled
    with ``subject`` (``digits on cpu``)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    compare, target = result["compare"], result["target"]
    figure = Figure(figsize=(12, 4.8), dpi=110)
    curves, fronts = figure.subplots(1, 2)
    for run in result["runs"]:
        label = f"seed {run['seed']}, {run['trials']} trials"
        curves.step(range(1, len(run["history"]) + 1), run["history"], where="post", label=label)
        xs, ys = _staircase(run["front_at_compare"])
        fronts.step(xs, ys, where="pre", marker="o", label=f"seed {run['seed']} after {compare}")
        if run["trials"] > compare:
            xs, ys = _staircase(run["front"])
            fronts.step(xs, ys, where="pre", marker="s", ls="--", label=f"seed {run['seed']} after {run['trials']}")
    curves.axhline(result["hv_union"], c="0.3", lw=0.8, label=f"union of all runs ({result['hv_union']:.3f})")
    curves.axhline(target * result["hv_reference"], c="tab:red", ls="--", lw=0.8,
                   label=f"{100 * target:.0f} % of the longest run")
    curves.axvline(compare, c="0.5", ls=":", lw=0.8)
    curves.set_xlabel("trials (repeats and ruled-out configurations not counted)")
    curves.set_ylabel("hypervolume (drop share kept x ln speed-up)")
    curves.set_title(f"{subject}: hypervolume against trials")
    curves.legend(fontsize="small", loc="lower right")
    xs, ys = _staircase(result["union_front"])
    fronts.step(xs, ys, where="pre", c="0.3", lw=2, alpha=0.4, label="union front")
    fronts.set_xscale("log")
    fronts.xaxis.set_major_locator(FixedLocator(SPEEDUP_TICKS))
    fronts.xaxis.set_minor_locator(NullLocator())
    fronts.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
    fronts.set_xlabel("paired speed-up over the baseline (log)")
    fronts.set_ylabel("drop / allowed drop (above the baseline = 0)")
    fronts.set_ylim(-0.05, 1.05)
    speedups = [r["speedup"] for r in result["union_front"] if math.isfinite(r["speedup"])]
    if speedups:
        fronts.set_xlim(min(0.9, min(speedups) * 0.9), max(speedups) * 1.15)
    fronts.set_title("feasible fronts (down and right is better)")
    fronts.legend(fontsize="small", loc="upper left")
    figure.tight_layout()
    figure.savefig(path)
