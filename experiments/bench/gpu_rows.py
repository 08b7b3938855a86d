"""MiniLM on an accelerator: the one-line reduced-precision path beside the project's stages, paired with
fp32 eager in one process (issue 24's rows).

    python -m experiments.bench.gpu_rows --device cuda [--batch-sizes 1 256] [--held-out sts-dev.tsv] [--out F]

Every row is timed in alternating rounds against fp32 eager on the same inputs (the spec's fixed latency
batch, padded to its longest sentence as a user's serving code pads it; :func:`pipeline.core.paired.
measure_paired`), so the speed-up is the median of per-round ratios with its 95 % interval. Rows:

* ``fp32`` under each compiled runtime;
* ``model.to(torch.bfloat16)`` under each compiled runtime: the one line users already have;
* the amp stage's whole-model bf16 policy (``AmpConfig(dtype="bfloat16", fp32_layers=())``);
* the pack stage (padding-free) alone and with the amp stage's bf16 policy.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from experiments.bench.settings import BENCH_LATENCY
from experiments.models.minilm import spec as minilm_spec
from pipeline.api import run_chain
from pipeline.core.evaluate import compute_metrics, count_macs
from pipeline.core.padding import latency_sample, trim_to_longest
from pipeline.core.paired import DeviceTimer, measure_paired
from pipeline.core.runtimes.registry import available_runtimes, prepare_runtime
from pipeline.core.spec import ModelSpec, move_batch
from pipeline.core.stage import StageConfig, StageContext
from pipeline.core.task_data import load_task_data
from pipeline.core.task_spec import with_task_data
from stages.amp.stage import AmpConfig
from stages.pack.stage import PackConfig

FULL_BF16 = AmpConfig(dtype="bfloat16", fp32_layers=())


def staged(model: nn.Module, configs: list[StageConfig], spec: ModelSpec, device: torch.device) -> nn.Module:
    """``model`` through the project's stages as a search trial builds it (the runner, :func:`run_chain`)."""
    return run_chain(model, configs, StageContext(spec=spec, device=device)).model


def variants(spec: ModelSpec, device: torch.device) -> list[tuple[str, nn.Module]]:
    """(row name, eager model on ``device``) for every row."""
    base = spec.build().to(device).eval()
    one_line = copy.deepcopy(base).to(torch.bfloat16)
    return [
        ("fp32", base),
        ("model.to(torch.bfloat16) (one line)", one_line),
        ("amp stage bf16 (whole model)", staged(base, [FULL_BF16], spec, device).to(device).eval()),
        ("pack (padding-free) fp32", staged(base, [PackConfig()], spec, device).to(device).eval()),
        ("pack + amp stage bf16", staged(base, [PackConfig(), FULL_BF16], spec, device).to(device).eval()),
    ]


def score(model: nn.Module, spec: ModelSpec, device: torch.device, held: ModelSpec | None) -> dict[str, float]:
    with torch.no_grad():
        values = {"metric": compute_metrics(model, spec.evaluation(), (spec.metric,), device)[spec.metric.name]}
        if held is not None:
            values["held_out"] = compute_metrics(model, held.evaluation(), (held.metric,), device)[held.metric.name]
    return values


def run(device: torch.device, batch_sizes: list[int], held_out: Path | None,
        compiled: tuple[str, ...] = ("compile", "compile_cudagraphs")) -> dict[str, Any]:
    spec = minilm_spec()
    held = with_task_data(spec, load_task_data(str(held_out))) if held_out is not None else None
    mask = spec.padding_mask
    assert mask is not None
    rows: list[dict[str, Any]] = []
    models = variants(spec, device)
    scores = {name: score(model, spec, device, held) for name, model in models}
    baseline_model = models[0][1]
    runtimes = [r for r in compiled if r in available_runtimes(device)]
    timer = DeviceTimer(device, BENCH_LATENCY)
    for batch in batch_sizes:
        inputs = move_batch(trim_to_longest(latency_sample(spec, batch), mask), device)
        real = float(inputs[mask].ne(0).float().mean())
        padded_flops = 2 * (count_macs(baseline_model, inputs) or 0)
        for runtime in ["eager", *runtimes]:
            for name, model in models:
                if runtime == "eager" and name != "fp32":
                    continue
                torch.compiler.reset()
                fn: Callable[..., Tensor] = prepare_runtime(model, runtime, device)
                with torch.no_grad():
                    for _ in range(3):  # compile / record outside the timed rounds
                        fn(*inputs)
                    started = time.perf_counter()
                    paired = measure_paired((baseline_model, inputs), (fn, inputs), timer, BENCH_LATENCY)
                seconds = paired.trial_ms / 1000.0
                rows.append({
                    "batch": batch, "tokens": list(inputs[mask].shape), "real_token_fraction": real,
                    "runtime": runtime, "row": name, **scores[name],
                    "speedup": paired.speedup, "ci": list(paired.ci), "trial_ms": paired.trial_ms,
                    "baseline_ms": paired.baseline_ms, "unstable": paired.unstable,
                    "tflops_padded": padded_flops / seconds / 1e12 if seconds else None,
                    "tflops_real": real * padded_flops / seconds / 1e12 if seconds else None,
                    "timing_seconds": time.perf_counter() - started,
                })
                print(json.dumps(rows[-1]), flush=True)
    return {"device": torch.cuda.get_device_name() if device.type == "cuda" else device.type,
            "torch": torch.__version__, "python": platform.python_version(), "load": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "baseline_scores": scores["fp32"], "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--held-out", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--runtimes", nargs="*", default=["compile", "compile_cudagraphs"])
    args = parser.parse_args()
    result = run(torch.device(args.device), args.batch_sizes, args.held_out, tuple(args.runtimes))
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text)
    for row in result["rows"]:
        print(f"b{row['batch']:<4} {row['runtime']:<19} {row['row']:<38} {row['speedup']:6.2f}x "
              f"[{row['ci'][0]:.2f}, {row['ci'][1]:.2f}]  metric {row['metric']:.2f}"
              + (f"  held-out {row['held_out']:.2f}" if 'held_out' in row else "")
              + f"  {row['tflops_padded'] or 0:.0f}/{row['tflops_real'] or 0:.0f} TFLOP/s padded/real")


if __name__ == "__main__":
    main()
