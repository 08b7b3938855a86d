"""MiniLM on an accelerator: the one-line reduced-precision path beside the project's stages, paired with
fp32 eager in one process (issue 24's rows).

    python -m paretorch.experiments.bench.gpu_rows --device cuda [--batch-sizes 1 256] [--held-out sts-dev.tsv]
        [--out F]
        [--rounds N]

Every row is timed in alternating rounds against fp32 eager on the same inputs (the spec's fixed latency
batch, padded to its longest sentence as a user's serving code pads it; :func:`paretorch.pipeline.core.paired.
measure_paired`), so the speed-up is the median of per-round ratios with its 95 % interval. Rows:

* ``fp32`` under each compiled runtime;
* ``model.to(torch.bfloat16)`` under each compiled runtime: the one line users already have;
* the amp stage's whole-model bf16 policy (``AmpConfig(dtype="bfloat16", fp32_layers=())``);
* the pack stage (padding-free) alone and with the amp stage's bf16 policy;
* end to end (``input: host token lists``): from the tokenizer's ``input_ids`` lists on the host to
  embeddings on the host, copies in and out included, paired with fp32 eager end to end: the padded
  models get the lists padded to the longest on the host (as ``tokenizer(..., padding=True)`` does), the
  packed ones run as a deployment does (:class:`paretorch.stages.pack.deploy.PackedEncoder`: packed on the host,
  one copy, one graph per token bucket). Beside them, the packed model fed the host-packed buffer already on
  the device (``input: device host-packed``), and per packed runtime whether its call (copy in and graph)
  ran with ``torch.cuda.set_sync_debug_mode("error")`` (``sync_free``).

Per row: the task metric (the spec's own, run on the row's model in eager mode: compiled numerics match
it to bf16 rounding), the held-out Spearman x 100 where ``--held-out`` is given, the real-token fraction
and the achieved TFLOP/s on padded work and on real tokens (FLOPs from torch's flop counter on the padded
fp32 model; real-token FLOPs scale the linear-layer work by the real-token fraction, which slightly
undercounts the attention of padded rows).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy
import torch
from torch import Tensor, nn

from paretorch.experiments.bench.settings import BENCH_LATENCY
from paretorch.experiments.models.minilm import spec as minilm_spec
from paretorch.pipeline.api import run_chain
from paretorch.pipeline.core.evaluate import compute_metrics, count_macs
from paretorch.pipeline.core.padding import latency_sample, trim_to_longest
from paretorch.pipeline.core.paired import measure_paired
from paretorch.pipeline.core.runtimes.registry import available_runtimes, prepare_runtime
from paretorch.pipeline.core.spec import Batch, ModelSpec, move_batch
from paretorch.pipeline.core.stage import StageConfig, StageContext
from paretorch.pipeline.core.task_data import load_task_data
from paretorch.pipeline.core.task_spec import with_task_data
from paretorch.pipeline.core.timing import DeviceTimer, clock_for, host_seconds
from paretorch.stages.amp.stage import AmpConfig
from paretorch.stages.pack.deploy import PackedEncoder
from paretorch.stages.pack.layout import pack_token_lists
from paretorch.stages.pack.packed import PackedBert
from paretorch.stages.pack.stage import PackConfig

FULL_BF16 = AmpConfig(dtype="bfloat16", fp32_layers=())


class Scores(TypedDict):
    """A row's model scored: the spec's metric, and the held-out one where given."""

    metric: float
    held_out: NotRequired[float]


class GpuRow(Scores):
    """A row at a batch, input kind and runtime, paired with fp32 eager: the speed-up, achieved TFLOP/s (padded
    work, real tokens only), and its output's largest difference from its own model in eager and from fp32."""

    batch: int
    tokens: list[int]
    real_token_fraction: float
    input: str
    runtime: str
    row: str
    speedup: float
    ci: list[float]
    trial_ms: float
    baseline_ms: float
    unstable: str | None
    tflops_padded: float | None
    tflops_real: float | None
    timing_seconds: float
    #: The packed rows' real tokens (pack rows only), and whether their call syncs with the host (host rows).
    packed_tokens: NotRequired[int]
    max_abs_diff_vs_eager: float
    max_abs_diff_vs_fp32: float
    sync_free: NotRequired[str]


class GpuRowsResult(TypedDict):
    """A ``gpu-rows-*.json`` file."""

    device: str
    torch: str
    python: str
    load: tuple[float, float, float]
    #: Absent from files written before the date was recorded.
    date: NotRequired[str]
    baseline_scores: Scores
    rounds: int
    rows: list[GpuRow]


def staged(model: nn.Module, configs: list[StageConfig], spec: ModelSpec, device: torch.device) -> nn.Module:
    """``model`` through the project's stages as a search trial builds it (the runner, :func:`run_chain`)."""
    return run_chain(model, configs, StageContext(spec=spec, device=device)).model


def variants(spec: ModelSpec, device: torch.device) -> list[tuple[str, nn.Module]]:
    """(row name, eager model on ``device``) for every row."""
    base = spec.build().to(device).eval()
    one_line = copy.deepcopy(base).to(torch.bfloat16)
    rows = [
        ("fp32", base),
        ("model.to(torch.bfloat16) (one line)", one_line),
        ("amp stage bf16 (whole model)", staged(base, [FULL_BF16], spec, device).to(device).eval()),
        ("pack (padding-free) fp32", staged(base, [PackConfig()], spec, device).to(device).eval()),
        ("pack + amp stage bf16", staged(base, [PackConfig(), FULL_BF16], spec, device).to(device).eval()),
    ]
    for name, model in rows:
        if name.startswith("pack") and not isinstance(model, PackedBert):
            raise SystemExit(f"error: the pack stage did not pack MiniLM here (row {name!r}): see pack.not_packed")
    return rows


def token_lists(batch: Batch, mask_index: int) -> list[list[int]]:
    """A host batch's rows as the tokenizer hands them over: each row's ids, without padding."""
    ids, mask = batch[0], batch[mask_index]
    return [row[: int(keep.ne(0).sum())].tolist() for row, keep in zip(ids, mask, strict=True)]


def padded_from_lists(lists: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """Token id lists padded to the longest on the host, as ``tokenizer(..., padding=True)`` pads them."""
    width = max(len(ids) for ids in lists)
    ids, mask = numpy.zeros((len(lists), width), numpy.int64), numpy.zeros((len(lists), width), numpy.int64)
    for row, tokens in enumerate(lists):
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def end_to_end(fn: Callable[..., Tensor], device: torch.device) -> Callable[[Sequence[Sequence[int]]], Tensor]:
    """A padded model's deployment call: token id lists padded on the host, copied in, run, copied out."""

    def run(lists: Sequence[Sequence[int]]) -> Tensor:
        ids, mask = padded_from_lists(lists)
        return fn(ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)).to("cpu", torch.float32)

    return run


def sync_free(encoder: PackedEncoder, lists: Sequence[Sequence[int]]) -> str:
    """Whether the packed call (the copy in and the graph; not the copy out) makes no device-to-host sync, in
    steady state: ``torch.cuda.set_sync_debug_mode("warn")``, two calls first (dynamo guards on the mode, so
    the first may compile or record again, which syncs), then the warnings of a third call."""
    if encoder.device.type != "cuda":
        return "not checked (CUDA only)"
    packed = pack_token_lists(lists, encoder.bucket, encoder.model.buckets)
    clock_for(encoder.device).wait()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen, torch.inference_mode():
            warnings.simplefilter("always")
            for _ in range(3):
                seen.clear()
                encoder.fn(packed.buffer.to(encoder.device, non_blocking=True), packed.tokens, packed.width)
        syncs = [str(w.message).splitlines()[0] for w in seen if "synchroniz" in str(w.message)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return "yes" if not syncs else f"no: {syncs[0]}"


def score(model: nn.Module, spec: ModelSpec, device: torch.device, held: ModelSpec | None) -> Scores:
    with torch.no_grad():
        values: Scores = {"metric": compute_metrics(model, spec.evaluation(), (spec.metric,), device)[spec.metric.name]}
        if held is not None:
            values["held_out"] = compute_metrics(model, held.evaluation(), (held.metric,), device)[held.metric.name]
    return values


def run(device: torch.device, batch_sizes: list[int], held_out: Path | None,
        compiled: tuple[str, ...] = ("compile", "compile_cudagraphs"), only: Sequence[str] = (),
        end_to_end_rows: bool = True, rounds: int | None = None) -> GpuRowsResult:
    spec = minilm_spec()
    held = with_task_data(spec, load_task_data(str(held_out))) if held_out is not None else None
    mask = spec.padding_mask
    assert mask is not None
    rows: list[GpuRow] = []
    models = [(name, model) for name, model in variants(spec, device)
              if name == "fp32" or not only or any(word in name for word in only)]
    scores = {name: score(model, spec, device, held) for name, model in models}
    baseline_model = models[0][1]
    runtimes = [r for r in compiled if r in available_runtimes(device)]
    settings = BENCH_LATENCY if rounds is None else replace(BENCH_LATENCY, rounds=rounds)
    timer = DeviceTimer(device, settings)

    def timed(batch: int, tokens: list[int], input_kind: str, runtime: str, name: str, baseline: Any, trial: Any,
              real: float, padded_flops: float, reference: Tensor, packed_tokens: int | None = None) -> None:
        with torch.no_grad():
            for _ in range(3):  # compile / record outside the timed rounds
                output = trial[0](*trial[1])
            # against the row's own model in eager on the padded batch: the compiled and packed paths compute it
            output = output.to("cpu", torch.float32)
            vs_eager = float((output - reference).abs().max())
            vs_fp32 = float((output - references["fp32"]).abs().max())
            started = host_seconds()
            paired = measure_paired(baseline, trial, timer, settings)
        seconds = paired.trial_ms / 1000.0
        row: GpuRow = {
            "batch": batch, "tokens": tokens, "real_token_fraction": real, "input": input_kind,
            "runtime": runtime, "row": name, **scores[name],
            "speedup": paired.speedup, "ci": list(paired.ci), "trial_ms": paired.trial_ms,
            "baseline_ms": paired.baseline_ms, "unstable": paired.unstable,
            "tflops_padded": padded_flops / seconds / 1e12 if seconds else None,
            "tflops_real": real * padded_flops / seconds / 1e12 if seconds else None,
            "timing_seconds": host_seconds() - started, "max_abs_diff_vs_eager": vs_eager,
            "max_abs_diff_vs_fp32": vs_fp32}
        if packed_tokens is not None:
            row["packed_tokens"] = packed_tokens
        rows.append(row)
        print(json.dumps(row), flush=True)

    for batch in batch_sizes:
        host_inputs = trim_to_longest(latency_sample(spec, batch), mask)
        inputs = move_batch(host_inputs, device)
        lists = token_lists(host_inputs, mask)
        real = float(inputs[mask].ne(0).float().mean())
        padded_flops = 2 * (count_macs(baseline_model, inputs) or 0)
        shape = list(inputs[mask].shape)
        device_baseline = (baseline_model, inputs)
        host_baseline = (end_to_end(baseline_model, device), (lists,))
        with torch.no_grad():
            references: dict[str, Tensor] = {name: model(*inputs).to("cpu", torch.float32) for name, model in models}
        for runtime in ["eager", *runtimes]:
            for name, model in models:
                if (runtime == "eager") != (name == "fp32") and (runtime == "eager" or only):
                    continue  # eager: the baseline only; fp32 compiled: unless --only picks rows
                torch.compiler.reset()
                fn: Callable[..., Tensor] = prepare_runtime(model, runtime, device)
                reference = references[name]
                timed(batch, shape, "device padded", runtime, name, device_baseline, (fn, inputs), real, padded_flops,
                      reference)
                if not end_to_end_rows:
                    continue
                if isinstance(model, PackedBert):
                    encoder = PackedEncoder(model, device, runtime)
                    packed = pack_token_lists(lists, encoder.bucket, model.buckets)
                    on_device = (packed.buffer.to(device), packed.tokens, packed.width)
                    timed(batch, shape, "device host-packed", runtime, name, device_baseline,
                          (encoder.fn, on_device), real, padded_flops, reference, packed_tokens=packed.tokens)
                    timed(batch, shape, "host token lists", runtime, name, host_baseline, (encoder, (lists,)), real,
                          padded_flops, reference, packed_tokens=packed.tokens)
                    rows[-1]["sync_free"] = sync_free(encoder, lists)  # after the timing: a raise could end a replay
                    print(json.dumps({"sync_free": rows[-1]["sync_free"]}), flush=True)
                else:
                    timed(batch, shape, "host token lists", runtime, name, host_baseline,
                          (end_to_end(fn, device), (lists,)), real, padded_flops, reference)
    return {"device": torch.cuda.get_device_name() if device.type == "cuda" else device.type,
            "torch": torch.__version__, "python": platform.python_version(), "load": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "baseline_scores": scores["fp32"],
            "rounds": settings.rounds, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--held-out", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--runtimes", nargs="*", default=["compile", "compile_cudagraphs"])
    parser.add_argument("--only", nargs="*", default=[],
                        help="rows whose name contains one of these words (fp32 always runs: it is the baseline)")
    parser.add_argument("--no-end-to-end", action="store_true", help="device-resident rows only")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"paired rounds per row (default {BENCH_LATENCY.rounds}: more narrow the intervals)")
    args = parser.parse_args()
    result = run(torch.device(args.device), args.batch_sizes, args.held_out, tuple(args.runtimes), args.only,
                 not args.no_end_to_end, args.rounds)
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text)
    for row in result["rows"]:
        print(f"b{row['batch']:<4} {row['input']:<19} {row['runtime']:<19} {row['row']:<38} {row['speedup']:6.2f}x "
              f"[{row['ci'][0]:.2f}, {row['ci'][1]:.2f}]  metric {row['metric']:.2f}"
              + (f"  held-out {row['held_out']:.2f}" if 'held_out' in row else "")
              + f"  {row['trial_ms']:.3f} ms  {row['tflops_padded'] or 0:.0f}/{row['tflops_real'] or 0:.0f} TFLOP/s "
              "padded/real" + f"  diff {row['max_abs_diff_vs_eager']:.2g} / fp32 {row['max_abs_diff_vs_fp32']:.2g}"
              + (f"  sync-free: {row['sync_free']}" if "sync_free" in row else ""))


if __name__ == "__main__":
    main()
