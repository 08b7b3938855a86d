"""BENCHMARKS.md from the raw JSON in ``experiments/bench/results/``: one table per benchmark result
(:mod:`paretorch.experiments.bench.harness`), then the ORT rows, the peers (sentence-transformers' own backends),
recovery tables, fidelity checks, busy-machine checks and search-quality curves, each rendered by its own
module."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from paretorch.experiments.bench.busy import BUSY_PREFIX
from paretorch.experiments.bench.busy import render as render_busy
from paretorch.experiments.bench.end_to_end import PREFIX as END_TO_END_PREFIX
from paretorch.experiments.bench.end_to_end import render as render_end_to_end
from paretorch.experiments.bench.fidelity_check import FIDELITY_CHECK_PREFIX
from paretorch.experiments.bench.fidelity_check import render as render_fidelity_check
from paretorch.experiments.bench.length_groups import LENGTH_GROUPS_PREFIX
from paretorch.experiments.bench.length_groups import render as render_length_groups
from paretorch.experiments.bench.one_liner_table import ONE_LINERS_PREFIX
from paretorch.experiments.bench.one_liner_table import render as render_one_liners
from paretorch.experiments.bench.ort_rows import ORT_ROWS_PREFIX
from paretorch.experiments.bench.ort_rows import render as render_ort_rows
from paretorch.experiments.bench.pack_agreement import PACK_AGREEMENT_PREFIX
from paretorch.experiments.bench.pack_agreement import render as render_pack_agreement
from paretorch.experiments.bench.paths import RESULTS_DIR
from paretorch.experiments.bench.peers import PEERS_PREFIX
from paretorch.experiments.bench.peers import render as render_peers
from paretorch.experiments.bench.probe_stability import PROBE_STABILITY_PREFIX
from paretorch.experiments.bench.probe_stability import render as render_probe_stability
from paretorch.experiments.bench.proxy_verdict import PROXY_VERDICT_PREFIX
from paretorch.experiments.bench.proxy_verdict import render as render_proxy_verdict
from paretorch.experiments.bench.recovery import RECOVERY_PREFIX
from paretorch.experiments.bench.recovery import render as render_recovery
from paretorch.experiments.bench.render_extra import (
    COMPILE_SHAPES_PREFIX,
    GPU_ROWS_PREFIX,
    MLX_CUDA_PREFIX,
    render_compile_shapes,
    render_gpu_rows,
    render_mlx_cuda,
)
from paretorch.experiments.bench.search_quality import SEARCH_QUALITY_PREFIX
from paretorch.experiments.bench.search_quality import render as render_search_quality
from paretorch.experiments.bench.tail_guard import TAIL_GUARD_PREFIX
from paretorch.experiments.bench.tail_guard import render as render_tail_guard
from paretorch.experiments.bench.timeline import SearchTimes
from paretorch.experiments.bench.timeline import render as render_timeline
from paretorch.pipeline.search.allowed_drop import DEFAULT_MAX_DROP, AllowedDrop

#: Extra metrics shown as the table's fidelity column, the first one the rows have.
FIDELITY_COLUMNS = ("neighbour_agreement", "mean_cosine")


class FastestPeer(TypedDict):
    name: str
    speedup: float


class SearchInfo(SearchTimes, total=False):
    """A bench result's ``search``: the search's trials, time and best trial, as measured during the search
    (keys recorded later are absent from older files); ``time_to_peer_seconds`` and ``fastest_peer`` are written
    by the peers' bench (:func:`paretorch.experiments.bench.peers.attach_time_to_peer`)."""

    trials: int
    search_seconds: float
    best_trial: int
    cache: str
    best_recipe_file: str
    runtimes: list[str]
    workload: str
    search_latency_ms: float
    #: The best trial's paired speed-up and its 95% interval (None where not recorded).
    search_speedup: list[float | None]
    stage_work: dict[str, str]
    #: ``[seconds, best feasible speed-up]`` pairs: the product's own curve.
    time_to_result: list[list[float]]
    #: Seconds from the search's start (the study's start included) to each finished trial's end, by trial number.
    trials_completed: list[float]
    machine_probe: object
    cpu_capability: str
    time_to_peer_seconds: float | None
    fastest_peer: FastestPeer


class HeldOutCheck(TypedDict):
    """A bench result's ``held_out``: the baseline and the search's best scored on data the search never saw."""

    data: str
    rows: int
    metric: str
    runtime: str
    baseline: float
    best: float
    drop: float
    relative_drop: float
    within_allowed: bool


def search_latency(search: SearchInfo) -> str:
    """The best trial's latency as the search measured it: its paired speed-up and the baseline's p50 over it
    (results written before the speed-up was recorded: the latency alone, as it was stored)."""
    speedup, low, high = search.get("search_speedup") or (None, None, None)
    if speedup is None:
        return f"{search['search_latency_ms']:.3f} ms during the search"
    interval = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    return (f"{speedup:.2f}x{interval} paired with the baseline during the search: {search['search_latency_ms']:.3f} "
            f"ms = the baseline's p50 / that speed-up")


def _fmt_ratio(base: float | None, value: float | None) -> str:
    if not base or not value or value != value:
        return "-"
    return f"{base / value:.2f}x"


def row_speedup(row: dict[str, Any], base_ms: float | None, batch: str) -> float | None:
    """A row's speed-up over fp32 eager: paired (``speedup``, the harness's rows since they are paired), else
    the baseline row's p50 over the row's (older result files); None where the row has neither."""
    if row.get("speedup") is not None:
        return float(row["speedup"])
    ms = row["latency_ms_p50"].get(batch)
    return base_ms / ms if base_ms and ms and ms == ms else None


def model_call_cell(row: dict[str, Any]) -> str:
    """The model call's paired speed-up beside a row's workload one (``-``: not measured)."""
    if row.get("model_call_speedup") is None:
        return "-"
    low, high = row.get("model_call_speedup_ci") or (math.nan, math.nan)
    return f"{row['model_call_speedup']:.2f}x [{low:.2f}, {high:.2f}]"


def speedup_cell(row: dict[str, Any], base_ms: float | None, batch: str) -> str:
    """The speed-up column: a paired speed-up with its 95% interval, else the ratio of p50s (older files)."""
    if row.get("speedup") is None:
        return _fmt_ratio(base_ms, row["latency_ms_p50"].get(batch))
    text = f"{row['speedup']:.2f}x"
    if row.get("speedup_ci"):
        low, high = row["speedup_ci"]
        text += f" [{low:.2f}, {high:.2f}]"
    return text + (" (unstable)" if row.get("speedup_unstable") else "")


def render_table(result: dict[str, Any]) -> str:
    batch = str(result["objective_batch"])
    rows = result["rows"]
    base = next((r for r in rows if r["kind"] == "baseline"), None)
    base_ms = base["latency_ms_p50"].get(batch) if base else None
    allowed = AllowedDrop.parse(result["max_drop"])
    limit = allowed.threshold(base["metric"]) if base else math.nan
    # Paired rows (speed-up and 95% interval measured in alternating rounds with fp32 eager) or older ones.
    paired = any(r.get("speedup") is not None for r in rows)
    singles = [r for r in rows if r["kind"] == "single" and r["drop"] == r["drop"]
               and r["drop"] <= limit and row_speedup(r, base_ms, batch) is not None]
    best_single = max(singles, key=lambda r: row_speedup(r, base_ms, batch) or 0.0) if singles else None
    # One fidelity metric next to the task metric, where the rows have one (older result files do not).
    fidelity = next((name for name in FIDELITY_COLUMNS if any(name in r.get("extra", {}) for r in rows)), None)
    # Rows timed on the search's workload (raw inputs to host outputs) carry the model call beside it.
    end_to_end = any(r.get("end_to_end") for r in rows)
    lines = [
        f"### {result['model']} on {result['device']} (objective: batch {batch}"
        + (f", allowed drop {allowed.describe(base['metric'] if base else None)})" if allowed != DEFAULT_MAX_DROP
           else ")"),
        "",
        f"torch {result['torch']}, measured {result['date']}; latency = median of >= "
        f"{result['latency_settings']['min_runs']} runs and >= {result['latency_settings']['min_seconds']} s "
        "after warm-up; compile time excluded."
        + (f" Speed-up: each row timed in {result['latency_settings'].get('rounds', 'the')} rounds alternating with "
           f"fp32 eager in the same process at batch {batch} (the order reversed every other round), the median of "
           "the per-round ratios [95% CI]; the p50 columns time each row alone." if paired else "")
        + (f" The search's runtimes: {', '.join(runtimes)}." if (runtimes := (result.get("search") or {})
                                                                 .get("runtimes")) else ""),
        "",
        f"| recipe | {result['metric']} | drop |" + (f" {fidelity} |" if fidelity else "")
        + f" p50 ms b{batch} | speed-up vs fp32{' (paired) [95% CI]' if paired else ''}"
        + (" (serve: strings to host outputs) | model call |" if end_to_end else " |")
        + " other batches (p50 ms) | size | note |",
        "| --- | --- | --- |" + (" --- |" if fidelity else "") + (" --- |" if end_to_end else "")
        + " --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ms = r["latency_ms_p50"].get(batch)
        others = ", ".join(f"b{b}: {v:.3f}" for b, v in r["latency_ms_p50"].items() if b != batch)
        note = r["note"]
        if r["kind"] == "search" and best_single:
            same = next((s["name"] for s in rows if s["kind"] == "single" and s["recipe"] == r["recipe"]), None)
            mine, theirs = row_speedup(r, base_ms, batch), row_speedup(best_single, base_ms, batch)
            note = (note + "; " if note else "") + (
                f"the same recipe as the '{same}' row: the search found nothing faster, and the ratio between "
                "the two rows is measurement spread" if same else
                f"{_fmt_ratio(mine, theirs)} vs best single ({best_single['name']})")
        size = f"{r['size_bytes'] / 1024:.0f} KiB" if r["size_bytes"] else "-"
        metric = f"{r['metric']:.4f}" if r["metric"] == r["metric"] else "-"
        drop = f"{r['drop']:+.4f}" if r["drop"] == r["drop"] else "-"
        if fidelity:
            value = r.get("extra", {}).get(fidelity)
            drop += f" | {value:.4f}" if value is not None and value == value else " | -"
        lines.append(f"| {r['name']}: `{r['recipe']}` | {metric} | {drop} | {f'{ms:.3f}' if ms else '-'} | "
                     f"{speedup_cell(r, base_ms, batch) if ms or r.get('speedup') is not None else '-'} | "
                     + (f"{model_call_cell(r)} | " if end_to_end else "") + f"{others} | {size} | {note} |")
    recheck = result.get("baseline_recheck_ms_p50", {}).get(batch)
    if recheck and base_ms:
        lines += ["", f"Drift: fp32 eager measured again after the search: {recheck:.3f} ms at batch {batch} "
                  f"(first: {base_ms:.3f} ms); "
                  + ("the speed-ups are paired (each row with fp32 eager in the same rounds), so drift between "
                     "rows does not enter them." if paired else "speed-ups use the first.")]
    if result.get("note"):
        lines += ["", f"Note: {result['note']}"]
    if result.get("held_out"):
        h = result["held_out"]
        lines += ["", f"Held-out check ({h['data']}, {h['rows']} rows, not seen by the search; {h['metric']}, "
                  f"best recipe @ {h['runtime']}): baseline {h['baseline']:.2f}, search best {h['best']:.2f}, drop "
                  f"{h['drop']:+.2f} ({100 * h['relative_drop']:+.2f} %): "
                  + ("within" if h["within_allowed"] else "**outside**") + " the allowed drop."]
    if (isa := result.get("isa")) and isa.get("emulated"):
        lines += ["", f"**Emulated {isa['emulated'].upper()} row** on a CPU with {', '.join(isa['flags'])}: "
                  f"{', '.join(f'{k}={v}' for k, v in isa['caps'].items())} caps {'; '.join(isa['reaches'])}; not "
                  f"reached: {'; '.join(isa['not_reached'])}."]
    if result.get("search"):
        s = result["search"]
        lines += ["", f"Search: {s['trials']} trials in {s['search_seconds']:.0f} s; best trial #{s['best_trial']} "
                  f"({search_latency(s)}); cache: {s['cache']}."]
        if s.get("time_to_peer_seconds") is not None or s.get("fastest_peer"):
            peer = s.get("fastest_peer", {})
            reached = s.get("time_to_peer_seconds")
            lines += ["", f"Time to the fastest peer ({peer.get('name', '?')}, {peer.get('speedup', 0):.2f}x, "
                      "same run): "
                      + (f"{reached:.0f} s of the search's {s['search_seconds']:.0f} s." if reached is not None
                         else f"not reached in the search's {s['search_seconds']:.0f} s.")]
        if s.get("stage_work"):
            work = "; ".join(f"{name}: {text}" for name, text in s["stage_work"].items())
            lines += ["", f"Stage work in the search (paid once per distinct prefix, cache hits reuse it): {work}."]
        peers = [r["latency_ms_p50"][batch] for r in rows if r["kind"] == "peer" and r["latency_ms_p50"].get(batch)]
        lines += render_timeline(s, base_ms / min(peers) if peers and base_ms else None)
    return "\n".join(lines)


#: Each other result file's section, in the order BENCHMARKS.md shows them: (file name prefix, renderer). A renderer
#: declares its file's shape; the parsed JSON it gets is unchecked.
SECTIONS: tuple[tuple[str, Callable[[Any], str]], ...] = (
    (ORT_ROWS_PREFIX, render_ort_rows), (PEERS_PREFIX, render_peers), (GPU_ROWS_PREFIX, render_gpu_rows),
    (MLX_CUDA_PREFIX, render_mlx_cuda), (COMPILE_SHAPES_PREFIX, render_compile_shapes),
    (RECOVERY_PREFIX, render_recovery), (FIDELITY_CHECK_PREFIX, render_fidelity_check), (BUSY_PREFIX, render_busy),
    (SEARCH_QUALITY_PREFIX, render_search_quality), (PACK_AGREEMENT_PREFIX, render_pack_agreement),
    (PROXY_VERDICT_PREFIX, render_proxy_verdict), (LENGTH_GROUPS_PREFIX, render_length_groups),
    (PROBE_STABILITY_PREFIX, render_probe_stability), (TAIL_GUARD_PREFIX, render_tail_guard),
    (END_TO_END_PREFIX, render_end_to_end), (ONE_LINERS_PREFIX, render_one_liners))


def render_markdown(folder: Path = RESULTS_DIR) -> str:
    """BENCHMARKS.md: one table per benchmark file, then the recovery tables (``recovery-*.json``), the
    fidelity checks (``fidelity-check-*.json``), the busy-machine checks and the search-quality curves."""
    files = sorted(folder.glob("*.json"))
    parts = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m paretorch.experiments.bench`) from the raw JSON in "
        "`experiments/bench/results/`. "
        "Every row is measured in the same process under the same latency settings; the search row replays the "
        "fastest Pareto recipe within the allowed drop and measures it again.",
        "",
    ]
    prefixes = tuple(prefix for prefix, _ in SECTIONS)
    for prefix, render in ((None, render_table), *SECTIONS):  # the search benches (no prefix) first
        for path in files:
            if (path.name.startswith(prefix) if prefix else not path.name.startswith(prefixes)):
                parts += [render(json.loads(path.read_text())), ""]
    return "\n".join(parts)
