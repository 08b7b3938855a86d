"""ONNX Runtime rows: the ``onnxruntime`` runtime's forms of one model against torch fp32 eager.

    taskset -c 0 python -m paretorch.experiments.bench.ort_rows --model minilm [--batch 32] [--threads 1]

Rows: ORT fp32 (no offline fusions), ORT + transformer fusions (token models), ORT dynamic int8
and ORT static int8 (QDQ, calibrated on the spec's calibration data), each the file the
``onnxruntime`` runtime makes from a recipe (the quantize stage's ``int8_dynamic`` /
``int8_static_pt2e`` mirrored), measured through the project's Runner: the task metric on the
spec's evaluation data from ORT's outputs, and the latency *paired* with torch fp32 eager
(:func:`paretorch.pipeline.core.paired.measure_paired`: rounds alternating with the baseline in this one
process, the speed-up the median of the per-round ratios with its 95% interval). Threads,
pinning (the process's CPU affinity) and the load average are stated in the output. One JSON file,
``ort-rows-<model>-<device>.json``; ``python -m paretorch.experiments.bench --render-only`` renders it into
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import TypedDict

import torch

from paretorch.experiments.bench.one_liner_table import RowsMachine
from paretorch.experiments.bench.paths import RESULTS_DIR
from paretorch.experiments.bench.settings import BENCH_LATENCY
from paretorch.pipeline.core.device import capabilities, describe, resolve_device
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.padding import latency_inputs
from paretorch.pipeline.core.paired import measure_paired
from paretorch.pipeline.core.spec import ModelSpec, move_batch
from paretorch.pipeline.core.stage import config_from_dict
from paretorch.pipeline.core.timing import DeviceTimer, host_seconds, process_clock
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.sources.resolve import resolve_spec

ORT_ROWS_PREFIX = "ort-rows-"

#: (row name, stage configs as dicts, fusions of the ONNX export, for token models only). The int8 rows
#: keep ``auto`` fusions: BERT fusions for token models, none for others.
ROWS: tuple[tuple[str, list[dict[str, object]], str, bool], ...] = (
    ("ORT fp32", [], "none", False),
    ("ORT + fusions", [], "bert", True),
    ("ORT dynamic int8", [{"stage": "quantize", "method": "int8_dynamic"}], "auto", False),
    ("ORT static int8 (QDQ)", [{"stage": "quantize", "method": "int8_static_pt2e"}], "auto", False),
)


class OrtRow(TypedDict, total=False):
    """A row: the baseline's or an ORT recipe's metric, paired speed-up and size, or why it was skipped."""

    name: str
    skipped: str
    recipe: str
    metric: float
    speedup: float
    ci: list[float]
    trial_ms: float | None
    baseline_ms: float | None
    size_bytes: int
    note: str
    session_seconds: float | None
    prepare_seconds: float
    unstable: str | None
    machine: str
    device: str


class OrtRowsMeasured(TypedDict):
    rows: list[OrtRow]
    metric_name: str


class OrtRowsResult(OrtRowsMeasured, RowsMachine):
    """An ``ort-rows-*.json`` file."""

    uptime_before: str
    uptime_after: str
    seconds: float
    torch: str
    date: str


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"uptime unavailable ({exc})"


def _is_token_model(spec: ModelSpec) -> bool:
    return any(not t.is_floating_point() and t.dim() >= 2 for t in spec.example_inputs(2))


def measure_rows(spec: ModelSpec, device: torch.device, batch: int) -> OrtRowsMeasured:
    """The baseline and every ORT row: metric, file size, session seconds, paired latency."""
    inputs = move_batch(latency_inputs(spec, batch, "eager")[0], device)
    timer = DeviceTimer(device, BENCH_LATENCY)
    clock = process_clock if device.type == "cpu" else None
    base_runner = Runner(recipe_pipeline([]), spec, device)
    base = base_runner.run(runtime="eager", exports=False).report
    baseline_fn = base_runner.prepare({}, "eager")
    rows: list[OrtRow] = [{"name": "torch fp32 eager (baseline)", "metric": base.metric_value,
                           "speedup": 1.0, "ci": [1.0, 1.0], "trial_ms": None, "baseline_ms": None,
                           "size_bytes": base.size_bytes, "note": ""}]
    for name, stages, fusions, token_only in ROWS:
        if token_only and not _is_token_model(spec):
            rows.append({"name": name, "skipped": "not a token model: the BERT fusions do not apply"})
            continue
        configs = [config_from_dict(dict(c)) for c in stages] + [
            config_from_dict({"stage": "export.onnx", "fusions": fusions})]
        runner = Runner(recipe_pipeline(configs), spec, device)
        started = host_seconds()
        try:
            result = runner.run(runtime="onnxruntime", exports=False)
        except InfeasibleConfig as exc:
            rows.append({"name": name, "skipped": f"infeasible: {exc.reason}"})
            continue
        seconds = host_seconds() - started
        fn = runner.prepare({}, "onnxruntime")
        paired = measure_paired((baseline_fn, inputs), (fn, inputs), timer, BENCH_LATENCY, cpu_clock=clock)
        report = result.report
        rows.append({
            "name": name, "recipe": result.recipe(spec.name).describe(), "metric": report.metric_value,
            "speedup": paired.speedup, "ci": list(paired.ci), "trial_ms": paired.trial_ms,
            "baseline_ms": paired.baseline_ms, "size_bytes": report.size_bytes,
            "session_seconds": report.extra.get("runtime_session_seconds"), "prepare_seconds": seconds,
            "unstable": paired.unstable, "machine": paired.machine.describe(), "device": report.device,
        })
        print(f"{name}: metric {report.metric_value:.4f}, {paired.speedup:.2f}x "
              f"[{paired.ci[0]:.2f}, {paired.ci[1]:.2f}] vs torch fp32 eager ({paired.trial_ms:.1f} vs "
              f"{paired.baseline_ms:.1f} ms)", flush=True)
    return {"rows": rows, "metric_name": base.metric_name}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paretorch.experiments.bench.ort_rows",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="digits")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    spec = resolve_spec(args.model)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    before = _uptime()
    print(f"{spec.name} on {describe(device)}; onnxruntime providers {capabilities(device).ort_providers}; "
          f"threads {args.threads}; CPU affinity {affinity}; {before}", flush=True)
    started = host_seconds()
    measured = measure_rows(spec, device, args.batch)
    result: OrtRowsResult = {
        "model": spec.name, "device": describe(device), "cpu": platform.processor() or platform.machine(),
        "batch": args.batch, "threads": args.threads, "affinity": affinity, "uptime_before": before,
        "uptime_after": _uptime(), "seconds": host_seconds() - started,
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), **measured,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{ORT_ROWS_PREFIX}{spec.name}-{device.type}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(render(result))
    print(f"written: {path}")
    return 0


def render(result: OrtRowsResult) -> str:
    """A Markdown section of one ORT rows file."""
    lines = [
        f"### ONNX Runtime rows: {result['model']} on {result['device']}, batch {result['batch']}",
        "",
        f"`python -m paretorch.experiments.bench.ort_rows --model {result['model']}` ({result['date']}, torch "
        f"{result['torch']}): {result['threads']} thread(s) for torch and onnxruntime (intra-op), CPU affinity "
        f"{result['affinity']}; load before: `{result['uptime_before']}`, after: `{result['uptime_after']}`. "
        "Speed-up: paired with torch fp32 eager in alternating rounds in one process (median of the per-round "
        "ratios, 95% interval).",
        "",
        f"| row | {result['metric_name']} | speed-up vs torch fp32 eager | p50 ms (row / baseline) | size | "
        "session s | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        if "skipped" in row:
            lines.append(f"| {row['name']} | - | - | - | - | - | {row['skipped']} |")
            continue
        times = f"{row['trial_ms']:.1f} / {row['baseline_ms']:.1f}" if row.get("trial_ms") else "-"
        speed = f"{row['speedup']:.2f}x [{row['ci'][0]:.2f}, {row['ci'][1]:.2f}]"
        session = f"{row['session_seconds']:.2f}" if row.get("session_seconds") is not None else "-"
        note = row.get("unstable") or row.get("note") or ""
        lines.append(f"| {row['name']} | {row['metric']:.4f} | {speed} | {times} | "
                     f"{row['size_bytes'] / 2**20:.1f} MiB | {session} | {note} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
