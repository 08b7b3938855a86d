"""Benchmarks (``make bench``): baseline, each single technique alone, and a search.

For one model spec on one device this measures, under identical latency settings:

* fp32 eager (the baseline);
* each single-technique recipe alone: torchao int8 dynamic, reduced precision
  (the AMP stage: bf16 or fp16 from the capability table), structured prune 0.3,
  torch.compile, and compile with CUDA graphs where the device has them;
* the best recipe a search of N trials finds within the allowed metric drop,
  re-measured here like every other row (search-time numbers are not reused);
* the baseline once more at the end, to show how far the machine drifted
  (a discarded warm-up pass precedes the first row).

Each row's speed-up is paired, as the search measures its trials (:class:`paretorch.pipeline.search.study_latency.
StudyLatency`): the row's model, as the runner measured it, timed in rounds alternating with fp32 eager in this
process at the objective batch (the order reversed every other round); the median of the per-round ratios with
its 95% interval (``speedup``, ``speedup_ci``). A drifting machine slows both sides of a round alike; the
absolute p50s (each row timed alone) are kept beside it.

Raw numbers go to ``experiments/bench/results/<model>-<device>.json``; every JSON
there is rendered into ``BENCHMARKS.md``. Run::

    python -m paretorch.experiments.bench --model digits --trials 30 --batch 32
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import torch
from rich.console import Console
from torch import Tensor

from paretorch.experiments.bench.isa import isa_info
from paretorch.experiments.bench.paths import MARKDOWN, RESULTS_DIR
from paretorch.experiments.bench.render import HeldOutCheck, SearchInfo, render_markdown, render_table
from paretorch.experiments.bench.settings import BENCH_LATENCY
from paretorch.experiments.bench.timeline import best_so_far, time_split, trial_ends
from paretorch.pipeline.core.device import capabilities, describe, move_module, resolve_device
from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.evaluate import ModelReport, task_metric
from paretorch.pipeline.core.paired import PairedLatency
from paretorch.pipeline.core.paths import results_dir
from paretorch.pipeline.core.runtimes.registry import available_runtimes, get_runtime, prepare_runtime
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage_config import StageConfig
from paretorch.pipeline.core.task_data import load_task_data
from paretorch.pipeline.core.task_spec import with_task_data
from paretorch.pipeline.core.timing import host_seconds
from paretorch.pipeline.core.workload import DEFAULT_WORKLOAD, workload_for
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.search import Search, SearchConfig, run_search
from paretorch.pipeline.search.allowed_drop import DEFAULT_MAX_DROP, AllowedDrop
from paretorch.pipeline.search.objectives import ATTR_METRICS, ATTR_RECIPE
from paretorch.pipeline.search.store import ATTR_MACHINE_PROBE
from paretorch.pipeline.search.study_latency import StudyLatency
from paretorch.pipeline.search.time_to_result import best_so_far as study_best_so_far
from paretorch.pipeline.search.time_to_result import time_to_result
from paretorch.pipeline.sources.resolve import resolve_spec
from paretorch.stages.amp.stage import AmpConfig
from paretorch.stages.distill.stage import DistillConfig
from paretorch.stages.prune.stage import PruneConfig
from paretorch.stages.quantize.methods import methods_on
from paretorch.stages.quantize.stage import QuantizeConfig

#: The distillation of the "prune + distill" rows: bounded in time, so a CPU run of MiniLM
#: (about 0.8 s per step of 16 on one core) stays affordable; on a GPU it ends by steps.
BENCH_DISTILL = DistillConfig(steps=400, lr=3e-4, batch_size=16, max_seconds=300)
#: The output-error budget of the "int8 with float fallback" row.
BENCH_FALLBACK_BUDGET = 0.01
#: Stages whose own time the rows and the search summary report.
COSTLY_STAGES = ("distill", "quantize", "amp", "prune")


@dataclass(frozen=True)
class Row:
    name: str
    kind: str  # "baseline" | "single" | "search"
    recipe: str
    metric: float
    drop: float
    latency_ms_p50: dict[str, float]
    latency_ms_p90: dict[str, float]
    size_bytes: int
    compile_seconds: float
    note: str = ""
    #: The report's extra metrics (fidelity to the unoptimized model where the metric is a task's).
    extra: dict[str, float] = field(default_factory=dict)
    #: Paired with fp32 eager at the objective batch: the median of per-round ratios and its 95% interval
    #: (None: the row failed, or a result written before rows were paired).
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    #: Why the paired speed-up is not trusted (its interval stayed wide); None when stable.
    speedup_unstable: str | None = None
    #: What ``speedup`` timed (:mod:`paretorch.pipeline.core.workload`: ``serve``, raw inputs to host outputs, as the
    #: search times it), and whether that is end to end (from the raw inputs).
    workload: str = "model"
    end_to_end: bool = False
    #: The model call alone paired with fp32 eager's (the figure beside the workload's).
    model_call_speedup: float | None = None
    model_call_speedup_ci: tuple[float, float] | None = None


def single_technique_recipes(device: torch.device) -> list[tuple[str, list[StageConfig], str]]:
    """(name, stage configs, runtime) for each technique alone, as the device allows."""

    caps = capabilities(device)
    rows: list[tuple[str, list[StageConfig], str]] = [("fp32 eager (baseline)", [], "eager")]
    if "int8_dynamic" in methods_on(caps):
        rows.append(("torchao int8 dynamic", [QuantizeConfig(method="int8_dynamic")], "eager"))
    dtype = caps.preferred_reduced_dtype()
    if dtype is not None:
        name = str(dtype).removeprefix("torch.")
        amp = AmpConfig.model_validate({"dtype": name, "error_budget": 0.01})
        rows.append((f"{name} mixed precision (amp)", [amp], "eager"))
    rows.append(("structured prune 0.3", [PruneConfig(ratio=0.3)], "eager"))
    for ratio in (0.3, 0.5):
        rows.append((f"structured prune {ratio} + distill", [PruneConfig(ratio=ratio), BENCH_DISTILL], "eager"))
    if "int8_dynamic" in methods_on(caps):
        fallback = QuantizeConfig(method="int8_dynamic", fallback_budget=BENCH_FALLBACK_BUDGET)
        rows.append(("int8 dynamic with float fallback", [fallback], "eager"))
    # Every other runtime available here, alone on the fp32 model (a plugin's too: MLX next to torch).
    for runtime in available_runtimes(device):
        if runtime != "eager":
            rows.append((f"{get_runtime(runtime).label(device)} (fp32)", [], runtime))
    if "mlx" in available_runtimes(device):  # MLX's own affine quantization, as the quantize stage maps to it
        rows.append(("mlx int4 weight-only (mx.quantize, groups of 32)",
                     [QuantizeConfig(method="intx_weight_only", group_size=32)], "mlx"))
    return rows


#: Makes a fresh callable of a measured recipe under its runtime (a compiled one compiles anew).
Prepare = Callable[[], Callable[..., Tensor]]


class Measured(NamedTuple):
    """One recipe measured by :func:`measure_recipe`."""

    report: ModelReport
    #: The stages' own cost (distillation and calibration seconds, apart from latency); "" when none.
    note: str
    #: How to run the measured model again (an exported runtime reopens the file it measured).
    prepare: Prepare
    #: The function the runner prepared and measured (a compiled model already compiled): what the row pairs.
    fn: Callable[..., Tensor]


def measure_recipe(spec: ModelSpec, device: torch.device, configs: list[StageConfig], runtime: str,
                   batch_sizes: tuple[int, ...]) -> Measured:
    """Apply ``configs`` (a fresh chain) and measure under the bench latency settings."""

    runner = Runner(recipe_pipeline(configs), spec, device, latency=BENCH_LATENCY, batch_sizes=batch_sizes)
    result = runner.run(runtime=runtime, exports=False)
    costs = [f"{name} {tally.seconds:.1f} s" for name, tally in runner.stage_tallies.items()
             if name in COSTLY_STAGES and tally.runs]
    records = {k: v for node in result.nodes.values() for k, v in node.records.items()}
    if "quantize.float_layers" in records:
        costs.append(f"{len(records['quantize.float_layers'])} layer(s) kept float")

    def again() -> Callable[..., Tensor]:
        return prepared(runner, runtime)

    fn = result.prepared if result.prepared is not None else again()
    return Measured(result.report, ("stage cost: " + ", ".join(costs)) if costs else "", again, fn)


def paired_timing(spec: ModelSpec, device: torch.device, batch: int, batch_sizes: tuple[int, ...],
                  workload: str = DEFAULT_WORKLOAD) -> StudyLatency:
    """How the rows are paired with fp32 eager at the objective ``batch``: the search's own paired timing
    (:meth:`StudyLatency.pair`: the same inputs per runtime, alternating order, retries of a wide interval) on the
    search's ``workload`` (``model``: the model call alone) under the bench latency settings; the baseline is
    prepared once, from a runner of its own."""
    runner = Runner(recipe_pipeline([]), spec, device, latency=BENCH_LATENCY, batch_sizes=batch_sizes)
    return StudyLatency(spec, device, batch, lambda: runner, BENCH_LATENCY, workload_for(workload, spec, batch))


def prepared(runner: Runner, runtime: str) -> Callable[..., Tensor]:
    """The recipe ``runner`` measured, ready for ``runtime`` once more (a compiled runtime recompiles from a fresh
    dynamo state; a runtime that read its export reuses what it opened)."""
    if get_runtime(runtime).compiles:
        torch.compiler.reset()
    return runner.prepare({}, runtime)


def row_from_report(name: str, kind: str, recipe: str, report: ModelReport, baseline: float | None,
                    spec: ModelSpec, note: str = "", paired: Paired | None = None) -> Row:
    drop = 0.0 if baseline is None else spec.metric.drop(baseline, report.metric_value)
    workload, model_call = paired if paired else (None, None)
    return Row(
        name=name, kind=kind, recipe=recipe, metric=report.metric_value, drop=drop,
        latency_ms_p50={str(b): s.p50_ms for b, s in report.latency.items()},
        latency_ms_p90={str(b): s.p90_ms for b, s in report.latency.items()},
        size_bytes=report.size_bytes, compile_seconds=report.compile_seconds, note=note, extra=dict(report.extra),
        speedup=workload.speedup if workload else None, speedup_ci=workload.ci if workload else None,
        speedup_unstable=workload.unstable if workload else None,
        workload=DEFAULT_WORKLOAD if model_call is not None else "model", end_to_end=model_call is not None,
        model_call_speedup=model_call.speedup if model_call else None,
        model_call_speedup_ci=model_call.ci if model_call else None,
    )


#: A row's paired measurements: on the search's workload, and (None: the workload is the model call) the model call.
Paired = tuple[PairedLatency, PairedLatency | None]


def measure_row(spec: ModelSpec, device: torch.device, configs: list[StageConfig], runtime: str,
                batch_sizes: tuple[int, ...], timings: tuple[StudyLatency, StudyLatency]) -> tuple[Measured, Paired]:
    """A row's recipe measured alone (:func:`measure_recipe`), then the very function measured paired with
    fp32 eager on the search's workload and as the model call alone (``timings``: :func:`paired_timing`'s)."""
    measured = measure_recipe(spec, device, configs, runtime, batch_sizes)
    workload, model_call = timings
    paired = workload.pair(measured.fn, runtime)
    return measured, (paired, model_call.pair(measured.fn, runtime) if workload.workload is not None else None)


def run_search_best(spec: ModelSpec, device: torch.device, trials: int, batch: int, max_drop: AllowedDrop,
                    work: Path) -> tuple[list[StageConfig], str, SearchInfo]:
    """Run a fresh search (no tracking) and return the fastest feasible Pareto recipe."""
    config = SearchConfig.load(None, latency_batch=batch, max_drop=max_drop, exports="none")
    storage = f"sqlite:///{work / 'bench-study.db'}"
    search = Search(spec, device, config, storage=storage, track=False,
                    name=f"bench-{spec.name}-{device.type}-{int(time.time())}")
    started = host_seconds()
    started_at = datetime.now()  # the trials' datetime_start / datetime_complete are local, naive times
    # The search points fd 2 at its third-party log: the trial lines go to a copy of the bench's stderr.
    with os.fdopen(os.dup(2), "w", buffering=1) as stderr:
        outcome = run_search(search, trials, console=Console(file=stderr))
    seconds = host_seconds() - started
    if not outcome.pareto:
        raise RuntimeError("the search found no feasible trial")
    key = search.plan.objectives.latency_key  # the baseline's p50 / the paired speed-up
    stage_tallies = search.model.runner.stage_tallies
    best = min(outcome.pareto, key=lambda t: t.user_attrs[ATTR_METRICS][key])
    recipe = Recipe.from_dict(best.user_attrs[ATTR_RECIPE])
    # The peers' bench times this file by their protocol (paretorch.experiments.bench.peers --recipe).
    best_file = recipe.save(work / best_recipe_name(spec.name, device.type))
    info: SearchInfo = {"trials": trials, "search_seconds": seconds, "best_trial": best.number, "cache": outcome.cache,
            "best_recipe_file": str(best_file),
            "runtimes": list(search.plan.runtimes), "workload": config.workload,
            "search_latency_ms": best.user_attrs[ATTR_METRICS][key],
            "search_speedup": [best.user_attrs[ATTR_METRICS].get(k) for k in ("speedup", "speedup_ci_low",
                                                                            "speedup_ci_high")],
            "stage_work": {name: tally.describe() for name, tally in stage_tallies.items() if name in COSTLY_STAGES},
            "timeline": best_so_far(outcome.study.trials, started_at),
            "time_to_result": time_to_result(study_best_so_far(outcome.study.trials, started_at)),
            "trials_completed": trial_ends(outcome.study.trials, started_at),
            "machine_probe": outcome.study.user_attrs.get(ATTR_MACHINE_PROBE),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "time_split": time_split(outcome.times.wall, outcome.times.by_category,
                                     {name: tally.seconds for name, tally in stage_tallies.items()})}
    return list(recipe.model_stages()), recipe.runtime, info


def best_recipe_name(model: str, device: str) -> str:
    """The file name of a bench search's best recipe, under ``<results>/bench/``."""
    return f"best-{model}-{device}.json"


def held_out_check(spec: ModelSpec, device: torch.device, path: Path, best: Prepare, runtime: str,
                   batch_sizes: tuple[int, ...], max_drop: AllowedDrop) -> HeldOutCheck:
    """The baseline and the search's best model (under its runtime: ``best`` prepares it) scored on
    labelled data the search never saw (``--held-out``), with the same metric and allowed drop."""
    data = load_task_data(str(path))
    held = with_task_data(spec, data)
    # Scored as evaluate_model scores: a compiled runtime in chunks of the largest batch size, one length bucket.
    baseline = task_metric(prepare_runtime(move_module(spec.build(), device).eval(), "eager", device), held, device,
                           "eager", batch_sizes)
    value = task_metric(best(), held, device, runtime, batch_sizes)
    drop = held.metric.drop(baseline, value)
    return {"data": path.name, "rows": len(data),
            "metric": held.metric.name, "runtime": runtime, "baseline": baseline, "best": value, "drop": drop,
            "relative_drop": drop / abs(baseline) if baseline else math.nan,
            "within_allowed": drop <= max_drop.threshold(baseline)}


def describe_chain(configs: list[StageConfig], runtime: str) -> str:
    parts = [c.describe() for c in configs] or ["fp32"]
    return " -> ".join(parts) + f" @ {runtime}"


def bench(model: str, device_name: str, trials: int, batch: int, max_drop: AllowedDrop,
          held_out: Path | None = None, singles: bool = True, only: tuple[str, ...] = ()) -> dict[str, Any]:
    device = resolve_device(device_name)
    spec = resolve_spec(model)
    if held_out is not None:
        load_task_data(str(held_out))  # a bad file stops here, before anything is measured
    batch_sizes = tuple(dict.fromkeys((*spec.latency_batch_sizes, batch)))
    rows: list[Row] = []
    baseline_metric: float | None = None
    # The first measurement of a process can run slow (lazy initialization, clocks
    # ramping up): one discarded pass of the baseline, so the baseline row is not it.
    print(f"[bench] {spec.name}: warm-up (fp32 eager, discarded)", file=sys.stderr, flush=True)
    measure_recipe(spec, device, [], "eager", batch_sizes)  # discarded
    timing = (paired_timing(spec, device, batch, batch_sizes), paired_timing(spec, device, batch, batch_sizes, "model"))
    recipes = single_technique_recipes(device)
    if only:  # the baseline and the rows whose name has one of ``only``
        recipes = recipes[:1] + [r for r in recipes[1:] if any(part in r[0] for part in only)]
    for name, configs, runtime in recipes if singles else recipes[:1]:  # the first is the baseline
        print(f"[bench] {spec.name}: {name}", file=sys.stderr, flush=True)
        try:
            # The baseline row too: fp32 eager paired with its own copy (1.0 within the interval on a quiet machine).
            measured, paired = measure_row(spec, device, configs, runtime, batch_sizes, timing)
        except Exception as exc:  # a row that cannot run is reported as such, not hidden
            rows.append(Row(name, "single", describe_chain(configs, runtime), float("nan"), float("nan"),
                            {}, {}, 0, 0.0, note=f"failed: {type(exc).__name__}: {exc}"[:300]))
            continue
        kind = "baseline" if baseline_metric is None else "single"
        rows.append(row_from_report(name, kind, describe_chain(configs, runtime), measured.report, baseline_metric,
                                    spec, note=measured.note, paired=paired))
        if baseline_metric is None:
            baseline_metric = measured.report.metric_value
    search_info: SearchInfo = {}
    held_out_info: HeldOutCheck | None = None
    if trials > 0:
        work = results_dir() / "bench"
        work.mkdir(parents=True, exist_ok=True)
        print(f"[bench] {spec.name}: search, {trials} trials, objective latency at batch {batch}",
              file=sys.stderr, flush=True)
        configs, runtime, search_info = run_search_best(spec, device, trials, batch, max_drop, work)
        best, paired = measure_row(spec, device, configs, runtime, batch_sizes, timing)
        rows.append(row_from_report(f"search best ({trials} trials)", "search", describe_chain(configs, runtime),
                                    best.report, baseline_metric, spec, paired=paired))
        if held_out is not None:
            print(f"[bench] {spec.name}: held-out check on {held_out}", file=sys.stderr, flush=True)
            held_out_info = held_out_check(spec, device, held_out, best.prepare, runtime, batch_sizes, max_drop)
    # The baseline again, last: how much the machine drifted over the run (the paired speed-ups do not use it).
    recheck = measure_recipe(spec, device, [], "eager", batch_sizes).report
    return {
        "model": spec.name, "metric": spec.metric.name, "device": describe(device), "device_kind": device.type,
        "isa": isa_info(),
        "objective_batch": batch, "max_drop": max_drop.to_json(), "latency_settings": asdict(BENCH_LATENCY),
        "torch": torch.__version__, "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "search": search_info,
        **({"held_out": held_out_info} if held_out_info else {}),
        "rows": [asdict(r) for r in rows],
        "baseline_recheck_ms_p50": {str(b): stats.p50_ms for b, stats in recheck.latency.items()},
    }


# --------------------------------------------------------------------------- markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paretorch.experiments.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="digits")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--batch", type=int, default=None, help="objective batch size (default: 1 on accelerators, "
                        "32 on the CPU)")
    parser.add_argument("--max-drop", default=DEFAULT_MAX_DROP.given(),
                        help="allowed metric drop: absolute (0.01) or a percentage of the baseline metric (1%%)")
    parser.add_argument("--held-out", type=Path, default=None, metavar="PATH",
                        help="labelled data (as --eval-data) the search never sees: after the search, the baseline "
                        "and the best recipe are scored on it with the same metric")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-singles", dest="singles", action="store_false",
                        help="the baseline row and the search only, without a row per single technique (where device "
                        "time is short; paretorch.experiments.bench.gpu_rows gives the one-line rows of a GPU)")
    parser.add_argument("--only", default="", metavar="WORDS",
                        help="comma list: of the single-technique rows, only those whose name has one of these words "
                        "(e.g. mlx); the baseline row always runs")
    parser.add_argument("--render-only", action="store_true", help="only rewrite BENCHMARKS.md from the JSON files")
    args = parser.parse_args(argv)
    try:
        max_drop = AllowedDrop.parse(args.max_drop)
    except ConfigError as exc:
        parser.error(str(exc))
    if not args.render_only:
        device = resolve_device(args.device)
        default_batch = 32 if device.type == "cpu" else 1
        batch = args.batch or default_batch
        only = tuple(w.strip() for w in args.only.split(",") if w.strip())
        result = bench(args.model, args.device, args.trials, batch, max_drop, args.held_out, args.singles, only)
        args.out.mkdir(parents=True, exist_ok=True)
        suffix = "" if batch == default_batch else f"-b{batch}"  # e.g. the GPU throughput objective, batch 256
        if only:  # a partial bench (e.g. the MLX rows) never replaces the full one
            suffix += "-only-" + "-".join(only)
        if (emulated := result.get("isa", {}).get("emulated")) is not None:
            suffix += f"-{emulated}-emulated"  # an AVX2 row on a wider CPU
        if max_drop != DEFAULT_MAX_DROP:  # -drop0.01 (absolute), -drop3pct
            suffix += f"-drop{max_drop.percent:g}pct" if max_drop.kind == "relative" else f"-drop{max_drop.amount:g}"
        path = args.out / f"{result['model']}-{result['device_kind']}{suffix}.json"
        path.write_text(json.dumps(result, indent=2))
        print(render_table(result))
    if args.out == RESULTS_DIR:
        MARKDOWN.write_text(render_markdown())
    return 0
