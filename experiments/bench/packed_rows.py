"""MiniLM padded vs packed (the pack stage), timed in interleaved rounds in one process, as JSON.

    .venv/bin/python -m paretorch.experiments.bench.packed_rows [--batch-sizes 1 32 256] [--dtypes float32 bfloat16]
        [--runtimes eager compile reduce-overhead] [--rounds 7] [--calls 5] [--threads N] [--device cuda]

Each row: a batch size, a dtype (``model.to(dtype)``) and a runtime (eager, ``torch.compile(dynamic=False)``
with inductor freezing as the pipeline's ``compile`` runtime, ``mode="reduce-overhead"`` (CUDA graphs,
CUDA only)); the padded model (the spec's latency batch cut to its longest sentence, as the pipeline
times it) and the packed one, a group of calls each per round on the timing service (the order reversed every other
round: :func:`paretorch.pipeline.core.timing.time_rounds`, blocks on the device's clock). Reported per row: median ms
per call of each, the ratio, their max abs output difference, the real-token fraction, and the packing step
alone (the row lengths read and the starts sent back, :func:`paretorch.stages.pack.layout.host_starts`, then the
layout on the device, :func:`paretorch.stages.pack.layout.device_layout`; exact and bucketed) in ms, eager.
The load average is printed before and after (CPU numbers on a shared host move with it).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
from collections.abc import Callable

import torch
from torch import Tensor, nn

from paretorch.experiments.models.minilm import spec as minilm_spec
from paretorch.pipeline.core.padding import latency_sample, trim_to_longest
from paretorch.pipeline.core.spec import move_batch
from paretorch.pipeline.core.timing import BlockTimer, time_block, time_rounds
from paretorch.stages.pack.bert import find_packable
from paretorch.stages.pack.layout import device_layout, host_starts
from paretorch.stages.pack.packed import PackedBert

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RUNTIMES = ("eager", "compile", "reduce-overhead")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def prepare(model: nn.Module, runtime: str) -> Callable[..., Tensor]:
    """The callable a runtime runs (a fresh compile per model)."""
    if runtime == "eager":
        return model
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    if runtime == "compile":
        return torch.compile(model, dynamic=False)
    compiled = torch.compile(model, dynamic=False, mode="reduce-overhead")

    def run(*inputs: Tensor) -> Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*inputs).clone()

    return run


def packing_ms(mask: Tensor, bucket: bool, repeats: int = 50) -> float:
    """Median ms of the packing step alone for a padded batch on the device (lengths to the host, starts back,
    the layout built on the device), eager, each step one region on the device's clock."""
    def step() -> object:
        return device_layout(*host_starts(mask, bucket))

    return statistics.median(time_block(step, (), mask.device, 1) for _ in range(repeats))


def explain_graphs(model: nn.Module, inputs: tuple[Tensor, ...]) -> dict[str, int]:
    torch.compiler.reset()
    explanation = torch._dynamo.explain(model)(*inputs)
    torch.compiler.reset()
    return {"graphs": explanation.graph_count, "graph_breaks": explanation.graph_break_count}


def row(model: nn.Module, inputs: tuple[Tensor, ...], dtype: str, runtime: str, rounds: int, calls: int,
        device: torch.device) -> dict[str, object]:
    padded_model = copy.deepcopy(model).to(device=device, dtype=DTYPES[dtype]).eval()
    paths = find_packable(padded_model)
    if isinstance(paths, str):
        raise SystemExit(f"error: MiniLM cannot be packed here: {paths}")
    packed_model = PackedBert(copy.deepcopy(padded_model), paths).eval()
    torch.compiler.reset()
    variants = {"padded": prepare(padded_model, runtime), "packed": prepare(packed_model, runtime)}
    with torch.inference_mode():
        outputs = {}
        for name, fn in variants.items():  # warm-up (compiles) and the outputs compared
            for _ in range(3):
                outputs[name] = fn(*inputs)
        # each variant's round: a block of ``calls`` calls, the order reversed every other round
        blocks = time_rounds([(fn, inputs) for fn in variants.values()], BlockTimer(device, calls, 0), rounds)
    times = {name: [ms / calls for ms in values] for name, values in zip(variants, blocks, strict=True)}
    padded_ms, packed_ms = (statistics.median(times[name]) for name in ("padded", "packed"))
    result: dict[str, object] = {
        "dtype": dtype, "runtime": runtime,
        "padded_ms": round(padded_ms, 4), "packed_ms": round(packed_ms, 4),
        "speedup": round(padded_ms / packed_ms, 3),
        "padded_ms_rounds": [round(t, 4) for t in times["padded"]],
        "packed_ms_rounds": [round(t, 4) for t in times["packed"]],
        "max_abs_diff": float((outputs["packed"].float() - outputs["padded"].float()).abs().max()),
    }
    if runtime != "eager":
        with torch.inference_mode():
            result["packed_dynamo"] = explain_graphs(packed_model, inputs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["float32", "bfloat16"])
    parser.add_argument("--runtimes", nargs="+", choices=RUNTIMES, default=list(RUNTIMES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5, help="calls per variant per round")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default=None, help="default: the accelerator if any, else cpu")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    accelerator = torch.accelerator.current_accelerator()
    device = torch.device(args.device or (accelerator.type if accelerator is not None else "cpu"))
    runtimes = [r for r in args.runtimes if r != "reduce-overhead" or device.type == "cuda"]
    spec = minilm_spec()
    model = spec.build()
    rows: list[dict[str, object]] = []
    report: dict[str, object] = {"device": str(device), "torch": torch.__version__,
                                 "threads": torch.get_num_threads(), "load_before": load_average(), "rows": rows}
    if device.type == "cuda":
        report["device_name"] = torch.cuda.get_device_name(device)
    for batch_size in args.batch_sizes:
        inputs = move_batch(trim_to_longest(latency_sample(spec, batch_size), spec.padding_mask or 1), device)
        mask = inputs[1]
        real = int(mask.ne(0).sum())
        shape = {"batch_size": batch_size, "width": int(mask.shape[1]), "real_tokens": real,
                 "real_fraction": round(real / mask.numel(), 4),
                 "packing_ms": round(packing_ms(mask, bucket=False), 4),
                 "packing_bucketed_ms": round(packing_ms(mask, bucket=True), 4)}
        for dtype in args.dtypes:
            for runtime in runtimes:
                entry = shape | row(model, inputs, dtype, runtime, args.rounds, args.calls, device)
                rows.append(entry)
                print(json.dumps({k: v for k, v in entry.items() if not k.endswith("_rounds")}), flush=True)
    report["load_after"] = load_average()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
