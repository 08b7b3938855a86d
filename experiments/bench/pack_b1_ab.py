"""Issue 33 at batch 1 on a CUDA GPU, real MiniLM: is the packed recipe's one-row call slower than the one line?

    python -m paretorch.experiments.bench.pack_b1_ab OUT.json [--rounds 40] [--device cuda]
        [--runtime compile_cudagraphs]

``gpu_rows`` times each row against fp32 eager in its own block of rounds, one row after another, so two rows'
milliseconds come from different minutes of the host. This script puts the one-row call of
``pack + amp stage bf16`` beside the one-line ``model.to(torch.bfloat16)`` and the amp stage's whole-model bf16
in one process, all under ``compile_cudagraphs`` on the device-padded b1 latency batch, and measures:

1. paired A/B, alternating rounds (:func:`paretorch.pipeline.core.paired.measure_paired`, ratio = A ms / B ms, so > 1
   means B is faster): one line / pack, amp / pack, one line / amp, one line / one line (the noise floor), pack /
   pack called through :meth:`PackedBert.padded` directly, and one line / pack again (drift);
2. per row: the host's time to issue one call (a loop of calls with no sync) and the time per call with the
   queue kept full (the loop then one sync), the max abs difference from fp32 eager;
3. per row, under ``torch.profiler``: CUDA kernels per call, GPU kernel time per call and the host ops that cost
   the most (what differs between the rows, if anything does).
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypedDict

import torch
from torch import Tensor, nn

from paretorch.experiments.bench.gpu_rows import FULL_BF16, staged
from paretorch.experiments.bench.settings import BENCH_LATENCY
from paretorch.experiments.models.minilm import spec as minilm_spec
from paretorch.pipeline.core.padding import latency_sample, trim_to_longest
from paretorch.pipeline.core.paired import measure_paired
from paretorch.pipeline.core.runtimes.registry import prepare_runtime
from paretorch.pipeline.core.spec import move_batch
from paretorch.pipeline.core.timing import DeviceTimer, clock_for
from paretorch.stages.pack.packed import PackedBert
from paretorch.stages.pack.stage import PackConfig

#: (A, B) row pairs, timed in this order; the last repeats the first (drift).
PAIRS = (("one line", "pack + amp"), ("amp", "pack + amp"), ("one line", "amp"), ("one line", "one line"),
         ("pack + amp", "pack + amp via padded()"), ("one line", "pack + amp"))


class PaddedOnly(nn.Module):
    """``forward`` = :meth:`PackedBert.padded` of the same model (what the one-row compiled call runs), with the
    model's amp boundary casts (its ``forward`` is wrapped: :mod:`paretorch.stages.amp.casting`)."""

    def __init__(self, packed: PackedBert) -> None:
        super().__init__()
        self.packed = packed

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.packed.padded(input_ids, attention_mask).float()


def build(device: torch.device) -> tuple[dict[str, nn.Module], tuple[Tensor, ...]]:
    """The rows' eager models and the device-padded b1 latency batch (as ``gpu_rows`` builds them)."""
    spec = minilm_spec()
    base = spec.build().to(device).eval()
    pack = staged(base, [PackConfig(), FULL_BF16], spec, device).to(device).eval()
    if not isinstance(pack, PackedBert):
        raise SystemExit("error: the pack stage did not pack MiniLM here")
    models = {"fp32": base, "one line": copy.deepcopy(base).to(torch.bfloat16),
              "amp": staged(base, [FULL_BF16], spec, device).to(device).eval(), "pack + amp": pack,
              "pack + amp via padded()": PaddedOnly(pack).eval()}
    assert spec.padding_mask is not None
    inputs = move_batch(trim_to_longest(latency_sample(spec, 1), spec.padding_mask), device)
    return models, tuple(inputs)


def host_times(fn: Callable[..., Tensor], inputs: tuple[Tensor, ...], calls: int = 2000) -> dict[str, float]:
    """Microseconds per call: to issue it (a loop with no sync) and with the queue full (the loop, then a sync), in
    host seconds of the device's clock (the timing service's)."""
    clock = clock_for(inputs[0].device)
    clock.wait()
    with torch.no_grad():
        start = clock.seconds()
        for _ in range(calls):
            fn(*inputs)
        issued = clock.seconds()
        clock.wait()
        done = clock.seconds()
    return {"issue_us": (issued - start) / calls * 1e6, "per_call_us": (done - start) / calls * 1e6}


class AbPair(TypedDict):
    """Row ``a`` paired with row ``b``: the median ratio a / b of their times, its 95% interval, both medians."""

    a: str
    b: str
    a_over_b: float
    ci: list[float]
    a_ms: float
    b_ms: float
    rounds: int
    unstable: str | None


def profiled(fn: Callable[..., Tensor], inputs: tuple[Tensor, ...], calls: int = 50) -> dict[str, object]:
    """Kernels and GPU kernel time per call, and the 12 host ops with the most self time, under torch.profiler."""
    device = inputs[0].device
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    clock = clock_for(device)
    clock.wait()
    with torch.no_grad(), torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            fn(*inputs)
        clock.wait()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    host = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
                  key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return {
        "kernels_per_call": sum(e.count for e in kernels) / calls,
        "gpu_kernel_us_per_call": sum(e.self_device_time_total for e in kernels) / calls,
        "kernels": {e.key[:90]: [e.count // calls, round(e.self_device_time_total / calls, 2)] for e in kernels},
        "host_ops": {e.key[:90]: [e.count // calls, round(e.self_cpu_time_total / calls, 2)] for e in host},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--runtime", default="compile_cudagraphs")
    parser.add_argument("--calls", type=int, default=2000, help="calls of the host-time loop")
    args = parser.parse_args()
    device = torch.device(args.device)
    models, inputs = build(device)
    with torch.no_grad():
        fp32 = models.pop("fp32")(*inputs).float()
    fns: dict[str, Callable[..., Tensor]] = {}
    name = torch.cuda.get_device_name() if device.type == "cuda" else device.type
    rows: dict[str, dict[str, object]] = {}
    pairs: list[AbPair] = []
    result: dict[str, object] = {"device": name, "torch": torch.__version__, "runtime": args.runtime,
                                 "batch": list(inputs[0].shape), "rows": rows, "pairs": pairs}
    for row_name, model in models.items():
        fn = prepare_runtime(model, args.runtime, device)
        with torch.no_grad():
            for _ in range(5):
                out = fn(*inputs)
            diff = float((out.float() - fp32).abs().max())
        fns[row_name] = fn
        row = rows[row_name] = {"max_abs_diff_vs_fp32": diff, **host_times(fn, inputs, args.calls),
                                **profiled(fn, inputs)}
        print(json.dumps({"row": row_name, **{k: v for k, v in row.items() if k not in ("kernels", "host_ops")}}),
              flush=True)
    settings = replace(BENCH_LATENCY, rounds=args.rounds)
    timer = DeviceTimer(device, settings)
    for a, b in PAIRS:
        paired = measure_paired((fns[a], inputs), (fns[b], inputs), timer, settings)
        entry: AbPair = {"a": a, "b": b, "a_over_b": paired.speedup, "ci": list(paired.ci), "a_ms": paired.baseline_ms,
                         "b_ms": paired.trial_ms, "rounds": paired.rounds, "unstable": paired.unstable}
        pairs.append(entry)
        print(json.dumps(entry), flush=True)
    args.out.write_text(json.dumps(result, indent=1))
    for row_name, row in rows.items():
        print(f"{row_name:<26} issue {row['issue_us']:7.1f} us  full queue {row['per_call_us']:7.1f} us  "
              f"kernels {row['kernels_per_call']:5.1f}  GPU {row['gpu_kernel_us_per_call']:6.1f} us  "
              f"diff {row['max_abs_diff_vs_fp32']:.4f}")
    for entry in pairs:
        low, high = entry["ci"]
        print(f"{entry['a']:>10} / {entry['b']:<26} {entry['a_over_b']:.3f} [{low:.3f}, {high:.3f}]"
              f"  {entry['a_ms']:.3f} vs {entry['b_ms']:.3f} ms")


if __name__ == "__main__":
    main()
