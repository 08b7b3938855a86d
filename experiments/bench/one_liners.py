"""The search's best against the one-liners, on a held-out model (issue 46.6), in one run.

    taskset -c 0 python -m paretorch.experiments.bench.one_liners --model efficientnet_lite0 --trials 20 [--threads 1]

Rows, in one process, at the spec's first latency batch (the search's objective batch), one thread for torch,
onnxruntime and OpenVINO alike:

* torch fp32 eager, the baseline;
* the one-liners: what a user gets from each library's public call on the unmodified model, without paretorch.
  ONNX Runtime fp32 (``torch.onnx.export(model, (example,), path, dynamo=True)``), ONNX Runtime int8 dynamic
  (``quantize_dynamic(pre, int8)`` with its defaults, after the pre-processing its warning asks for,
  ``quant_pre_process(fp32, pre)``: on EfficientNet-Lite0's dynamo export, ``quantize_dynamic`` alone fails in ONNX
  shape inference, "Inferred shape and existing shape differ in dimension 0: (1280) vs (1000)"; where the
  pre-processing itself fails, as on all-mpnet-base-v2's export, ``quantize_dynamic`` alone, and the row says so),
  OpenVINO fp32
  (``openvino.convert_model(model, example_input=example)``, compiled at ``INFERENCE_PRECISION_HINT`` f32) and, where
  OpenVINO picks another precision by itself (bf16 on a CPU with AMX or AVX512-BF16), OpenVINO at its default. The
  files are opened as paretorch's runtimes open theirs (:func:`paretorch.pipeline.core.ort_session.open_session`:
  all graph optimizations, sequential, no spinning; :func:`paretorch.pipeline.core.ov_session.open_ir`), torch
  tensors in and out;
* the search's best: a fresh search of ``--trials`` trials (:func:`paretorch.experiments.bench.harness.run_search_best`:
  the default search config, no tracking), its fastest feasible Pareto recipe replayed by the engine.

Metric: the spec's, from each row's own outputs on the spec's evaluation data, with its drop from torch fp32 eager and
whether that is within the allowed drop. Timing: every row in the same rounds, interleaved
(:func:`paretorch.pipeline.core.timing.time_rounds`, the order reversed every other round, the bench's thorough budget
a round); a row's speed-up is the median of its per-round ratios to torch fp32 eager with a 95 % interval, and the
search's best is compared with the fastest one-liner within the drop the same way (that one-liner's time / the best's,
per round). The load averages before and after are in the file and the section. One JSON file,
``one-liners-<model>-<device>.json``; ``python -m paretorch.experiments.bench --render-only`` renders it into
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

import torch
from torch import Tensor, nn

from paretorch.experiments.bench.harness import describe_chain, measure_recipe, run_search_best
from paretorch.experiments.bench.isa import cpu_description
from paretorch.experiments.bench.one_liner_table import (
    ONE_LINERS_PREFIX,
    BestAgainstOneLiner,
    OneLinerResult,
    OneLinerRow,
    SearchSummary,
    render,
)
from paretorch.experiments.bench.paths import RESULTS_DIR
from paretorch.experiments.bench.peers import speedup
from paretorch.experiments.bench.settings import BENCH_LATENCY
from paretorch.pipeline.core.device import describe, resolve_device
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.evaluate import evaluation_outputs, scoring_chunks
from paretorch.pipeline.core.input_agreement import Reference, TailGuard
from paretorch.pipeline.core.latency import batch_size_of
from paretorch.pipeline.core.ort_session import open_session
from paretorch.pipeline.core.ov_session import default_precision, open_ir
from paretorch.pipeline.core.padding import latency_inputs
from paretorch.pipeline.core.paths import results_dir
from paretorch.pipeline.core.spec import Batch, ModelSpec, move_batch
from paretorch.pipeline.core.timing import DeviceTimer, host_seconds, time_rounds
from paretorch.pipeline.core.user_files import SourceOptions
from paretorch.pipeline.search.allowed_drop import DEFAULT_MAX_DROP, AllowedDrop
from paretorch.pipeline.sources.resolve import resolve_spec

#: The distributions whose versions the file records.
VERSIONS = ("torch", "onnxruntime", "openvino", "onnx")


@dataclass(frozen=True)
class Side:
    """A row made and ready to time: its prepared callable and the inputs it is timed on."""

    name: str
    kind: str
    how: str
    fn: Callable[..., Tensor]
    inputs: Batch
    prepare_seconds: float
    precision: str = ""
    #: The engine runtime it runs under (the search's best: scored in the chunks the search scores it in,
    #: :func:`~paretorch.pipeline.core.evaluate.scoring_chunks`: one shape for a compiled runtime, not a graph per
    #: evaluation batch); empty: per evaluation batch.
    runtime: str = ""


#: How the ONNX Runtime int8 one-liner is made: with the pre-processing its warning asks for, or, where that fails
#: (ONNX Runtime 1.31's symbolic shape inference on all-mpnet-base-v2's dynamo export: "TypeError: object of type
#: 'NoneType' has no len()" in an Expand), ``quantize_dynamic`` on the fp32 file alone.
ORT_INT8_HOW = "quant_pre_process(fp32, pre); quantize_dynamic(pre, int8)"
ORT_INT8_UNPROCESSED_HOW = "quantize_dynamic(fp32, int8) (quant_pre_process failed on this export)"


def _made(name: str, how: str, make: Callable[[], Callable[..., Tensor]], inputs: Batch,
          precision: str = "") -> Side | OneLinerRow:
    """A one-liner's side, made by ``make`` (timed), or the row that says why it could not be made."""
    print(f"[one-liners] {name}: {how}", flush=True)
    started = host_seconds()
    try:
        fn = make()
    except Exception as exc:  # the library's own failure (each has its types): the row says it, the run goes on
        error = f"{type(exc).__name__}: {exc}"[:300]
        print(f"[one-liners] {name} could not be made: {error}", flush=True)
        return {"name": name, "kind": "one-liner", "how": how, "error": error}
    return Side(name, "one-liner", how, fn, inputs, host_seconds() - started, precision)


def one_liners(model: nn.Module, inputs: Batch, device: torch.device, work: Path) -> list[Side | OneLinerRow]:
    """ONNX Runtime fp32 and int8 dynamic, OpenVINO f32 (and OpenVINO's own default precision where it differs),
    each from the library's public call on ``model`` with ``inputs`` as the example (a static batch: ONNX Runtime
    runs other batch sizes in chunks of it)."""
    import onnxruntime.quantization
    import openvino
    from onnxruntime.quantization.shape_inference import quant_pre_process

    work.mkdir(parents=True, exist_ok=True)
    batch = int(inputs[0].shape[0])
    fp32, pre, int8 = work / "model.onnx", work / "model.pre.onnx", work / "model.int8.onnx"
    xml = work / "model.xml"

    def ort_fp32() -> Callable[..., Tensor]:
        # The batch axis, and a token axis (an integer input's second), are dynamic: a text model's
        # evaluation batches are padded to their own longest sentence.
        names = [f"input_{i}" for i in range(len(inputs))]
        axes = {name: {0: "batch"} | ({1: "tokens"} if not x.is_floating_point() and x.dim() > 1 else {})
                for name, x in zip(names, inputs, strict=True)}
        torch.onnx.export(model, inputs, str(fp32), dynamo=True, input_names=names, dynamic_axes=axes)
        return open_session(fp32, device, fixed_batch=batch)

    int8_how = ORT_INT8_HOW

    def ort_int8() -> Callable[..., Tensor]:
        nonlocal int8_how
        source = pre
        try:
            quant_pre_process(str(fp32), str(pre))
        except Exception as exc:  # its symbolic shape inference does not cover every export: quantize without it
            print(f"[one-liners] quant_pre_process failed ({type(exc).__name__}: {str(exc)[:120]}): "
                  "quantize_dynamic on the fp32 file, as ONNX Runtime itself allows", flush=True)
            source, int8_how = fp32, ORT_INT8_UNPROCESSED_HOW
        onnxruntime.quantization.quantize_dynamic(str(source), str(int8))
        return open_session(int8, device, fixed_batch=batch)

    def ov_ir(precision: str) -> Callable[[], Callable[..., Tensor]]:
        def make() -> Callable[..., Tensor]:
            if not xml.is_file():
                openvino.save_model(openvino.convert_model(model, example_input=inputs), str(xml),
                                    compress_to_fp16=False)
            return open_ir(xml, device, precision=precision)  # type: ignore[arg-type]  # f32 or bf16
        return make

    sides = [_made("ONNX Runtime fp32", "torch.onnx.export(model, (example,), path, dynamo=True)", ort_fp32, inputs)]
    if isinstance(sides[0], Side):
        made = _made("ONNX Runtime int8 dynamic", ORT_INT8_HOW, ort_int8, inputs)
        sides.append(replace(made, how=int8_how) if isinstance(made, Side) else made)
    sides.append(_made("OpenVINO fp32", "openvino.convert_model(model, example_input=example)", ov_ir("f32"),
                       inputs, "f32"))
    chosen = default_precision(device)
    if chosen != "f32":
        sides.append(_made(f"OpenVINO default ({chosen})", "openvino.compile_model(converted, 'CPU')", ov_ir(chosen),
                           inputs, chosen))
    return sides


def _rows(sides: list[Side], spec: ModelSpec, device: torch.device, samples: list[list[float]],
          allowed: float) -> list[OneLinerRow]:
    """Each side's row: its metric on the evaluation data, its inputs against torch fp32 eager's outputs by the
    search's own per-input guard (:class:`~paretorch.pipeline.core.input_agreement.TailGuard`, its defaults), and
    its speed-up over the shared rounds. The baseline comes first."""
    rows: list[OneLinerRow] = []
    baseline_metric = 0.0
    reference: Reference | None = None
    guard = TailGuard()
    for side, times in zip(sides, samples, strict=True):
        try:
            chunk, mask = (scoring_chunks(spec, side.runtime, (batch_size_of(side.inputs),)) if side.runtime
                           else (None, None))
            outputs, targets = evaluation_outputs(side.fn, spec.evaluation(), device, chunk, mask)
        except InfeasibleConfig as exc:  # a one-liner that cannot score the evaluation data: its row says why
            if side.kind == "baseline":
                raise
            print(f"[one-liners] {side.name} could not be scored: {exc}", flush=True)
            rows.append({"name": side.name, "kind": side.kind, "how": side.how, "error": str(exc)[:300]})
            continue
        metric = float(spec.metric.compute(outputs, targets).item())
        if reference is None:
            baseline_metric, reference = metric, Reference.of(outputs, spec.output_kind)
        drop = spec.metric.drop(baseline_metric, metric)
        inputs = reference.compare(outputs).metrics()
        tail = guard.failure(inputs)
        ratio, ci = speedup(samples[0], times)
        row: OneLinerRow = {"name": side.name, "kind": side.kind, "how": side.how, "metric": metric, "drop": drop,
                            "within_drop": drop <= allowed, "inputs": inputs, "within_tail": tail is None,
                            "speedup": ratio, "ci": list(ci), "ms": statistics.median(times),
                            "prepare_seconds": side.prepare_seconds}
        if tail is not None:
            row["tail"] = tail
        if side.precision:
            row["precision"] = side.precision
        rows.append(row)
    return rows


def best_against_one_liner(sides: list[Side], rows: list[OneLinerRow],
                           samples: list[list[float]]) -> BestAgainstOneLiner | None:
    """The search's best against the fastest one-liner that the search's own constraints would keep (within the drop
    and the per-input guard), per round (None: no such one-liner)."""
    timed = {side.name: times for side, times in zip(sides, samples, strict=True)}
    within = [row for row in rows if row["kind"] == "one-liner" and row.get("within_drop")
              and row.get("within_tail", True)]
    best = next(row for row in rows if row["kind"] == "search")
    if not within:
        return None
    fastest = max(within, key=lambda row: row["speedup"])
    ratio, ci = speedup(timed[fastest["name"]], timed[best["name"]])
    return {"one_liner": fastest["name"], "ratio": ratio, "ci": list(ci)}


def _search_side(spec: ModelSpec, device: torch.device, trials: int, batch: int,
                 max_drop: AllowedDrop) -> tuple[Side, SearchSummary]:
    """A fresh search's fastest feasible Pareto recipe, replayed and prepared; what the search took."""
    work = results_dir() / "bench"
    work.mkdir(parents=True, exist_ok=True)
    print(f"[one-liners] {spec.name}: search, {trials} trials, objective latency at batch {batch}", flush=True)
    configs, runtime, info = run_search_best(spec, device, trials, batch, max_drop, work)
    started = host_seconds()
    best = measure_recipe(spec, device, configs, runtime, (batch,))
    recipe = describe_chain(configs, runtime)
    inputs = move_batch(latency_inputs(spec, batch, runtime)[0], device)
    side = Side(f"search best ({trials} trials)", "search", recipe, best.fn, inputs, host_seconds() - started,
                runtime=runtime)
    summary: SearchSummary = {"trials": trials, "search_seconds": float(info["search_seconds"]),
                              "best_trial": int(info["best_trial"]), "best_recipe": recipe,
                              "runtimes": list(info["runtimes"]), "time_to_result": list(info["time_to_result"]),
                              "trials_completed": list(info["trials_completed"])}
    return side, summary


def measure(spec: ModelSpec, device: torch.device, trials: int, batch: int,
            max_drop: AllowedDrop) -> tuple[list[OneLinerRow], SearchSummary, BestAgainstOneLiner | None]:
    """Search, make the one-liners, time every row in the same interleaved rounds, score each."""
    search, summary = _search_side(spec, device, trials, batch, max_drop)
    inputs = move_batch(latency_inputs(spec, batch, "eager")[0], device)
    started = host_seconds()
    base = measure_recipe(spec, device, [], "eager", (batch,))
    baseline = Side("torch fp32 eager (baseline)", "baseline", "model.eval()", base.fn, inputs,
                    host_seconds() - started)
    made = one_liners(spec.build().eval(), inputs, device, results_dir() / "bench" / f"one-liners-{spec.name}")
    sides = [baseline, *(side for side in made if isinstance(side, Side)), search]
    timer = DeviceTimer(device, BENCH_LATENCY)
    print(f"[one-liners] timing {len(sides)} rows together, {BENCH_LATENCY.rounds} rounds", flush=True)
    timer.warm_up([(side.fn, side.inputs) for side in sides])
    samples = time_rounds([(side.fn, side.inputs) for side in sides], timer, BENCH_LATENCY.rounds)
    rows = _rows(sides, spec, device, samples, max_drop.threshold(base.report.metric_value))
    failed = [row for row in made if not isinstance(row, Side)]
    return [*rows[:-1], *failed, rows[-1]], summary, best_against_one_liner(sides, rows, samples)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min) on {os.cpu_count()} core(s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paretorch.experiments.bench.one_liners",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="efficientnet_lite0", help="a built-in name or any --model form of "
                        "paretorch optimize (hf:DIR, file.py:attr, model.pt2, ...)")
    parser.add_argument("--eval-data", default=None, help="labelled data of the task, as paretorch optimize takes it")
    parser.add_argument("--inputs-file", default=None, help="inputs of an hf:, TorchScript or .pt2 model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--batch", type=int, default=None, help="objective and timed batch (default: the spec's first "
                        "latency batch)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-drop", default=DEFAULT_MAX_DROP.given())
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--note", default="", help="a line the section prints under the table (e.g. what else ran)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    spec = resolve_spec(args.model, SourceOptions(inputs_file=args.inputs_file, eval_data=args.eval_data))
    max_drop = AllowedDrop.parse(args.max_drop)
    batch = args.batch or spec.latency_batch_sizes[0]
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    before = _load()
    print(f"[one-liners] {spec.name} on {describe(device)}, batch {batch}, {args.threads} thread(s), CPU affinity "
          f"{affinity}; load {before}", flush=True)
    started = host_seconds()
    rows, summary, best = measure(spec, device, args.trials, batch, max_drop)
    baseline_metric = rows[0].get("metric", 0.0)
    result: OneLinerResult = {
        "model": spec.name, "device": describe(device), "cpu": cpu_description() or platform.machine(),
        "batch": batch, "threads": args.threads, "affinity": affinity, "load_before": before, "load_after": _load(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": shlex.join(["python", "-m", "paretorch.experiments.bench.one_liners", *(argv or sys.argv[1:])]),
        "versions": {name: metadata.version(name) for name in VERSIONS}, "metric_name": spec.metric.name,
        "max_drop": max_drop.given(), "allowed_drop": max_drop.threshold(baseline_metric),
        "rounds": BENCH_LATENCY.rounds, "seconds": host_seconds() - started, "search": summary, "rows": rows,
        "best_against_one_liner": best,
    }
    if args.note:
        result["note"] = args.note
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{ONE_LINERS_PREFIX}{spec.name}-{device.type}.json"
    path.write_text(json.dumps(result, indent=2))
    print(render(result))
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
