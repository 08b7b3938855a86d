"""How much distillation each pruning needs: metric after prune + distill, per step count.

    python -m paretorch.experiments.bench.recovery --model minilm --device cuda --steps 0 300 1000 \
        --prune ffn:0.2 heads:0.25 depth:0.17 --out experiments/bench/results

Each pruned model is made once, then distilled from scratch for each step count (the
learning-rate schedule is that of the step count). One JSON file per run,
``recovery-<model>-<device>.json``: per prune and step count, the metric, the drop from
the unpruned model, the distillation's seconds and its teacher passes. It answers which
prunes a search's distillation budget can bring back within an allowed drop.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import NotRequired, TypedDict

import torch

from paretorch.pipeline.core.device import resolve_device
from paretorch.pipeline.core.evaluate import compute_metric
from paretorch.pipeline.core.spec import ModelSpec, load_model
from paretorch.pipeline.core.stage import StageContext, transform
from paretorch.pipeline.core.timing import host_seconds
from paretorch.pipeline.sources.resolve import resolve_spec
from paretorch.stages.distill.stage import DistillConfig
from paretorch.stages.prune.stage import PruneConfig

#: Result files of this script start so (the benchmark tables skip them).
RECOVERY_PREFIX = "recovery-"

#: ``kind:ratio`` on the command line -> a prune config.
PRUNE_KINDS = {
    "ffn": lambda r: PruneConfig(ratio=r, head_ratio=0.0, ffn_ratio=r),
    "heads": lambda r: PruneConfig(ratio=r, head_ratio=r, ffn_ratio=0.0),
    "both": lambda r: PruneConfig(ratio=r),
    "depth": lambda r: PruneConfig(method="depth", ratio=r),
}


def prune_config(text: str) -> PruneConfig:
    kind, _, ratio = text.partition(":")
    if kind not in PRUNE_KINDS or not ratio:
        raise argparse.ArgumentTypeError(f"'{text}': give KIND:RATIO with KIND one of {', '.join(PRUNE_KINDS)}")
    return PRUNE_KINDS[kind](float(ratio))


def same_name_layers(student: torch.nn.Module, teacher: torch.nn.Module) -> tuple[tuple[str, str], ...]:
    """``(name, name)`` for every transformer layer (``....layer.N``) both models have."""
    teacher_names = {name for name, _ in teacher.named_modules()}
    return tuple((name, name) for name, _ in student.named_modules()
                 if name.rsplit(".", 1)[-1].isdigit() and name.rsplit(".", 2)[-2] == "layer" and name in teacher_names)


def metric_of(model: torch.nn.Module, spec: ModelSpec, device: torch.device) -> float:
    model = model.to(device).eval()
    return compute_metric(model, spec.evaluation(), spec.metric, device)


DEFAULT_NOTE = "prune once, then distill from scratch per step count"


class RecoveryRow(TypedDict):
    """One prune, distilled for ``steps`` at ``lr`` (0 steps: pruned alone): the metric, its drop, the time."""

    prune: dict[str, object]
    steps: int
    lr: float
    hidden_layers: int
    metric: float
    drop: float
    seconds: float
    teacher_passes: int


class RecoveryResult(TypedDict):
    """A ``recovery-*.json`` file."""

    model: str
    device: str
    host: str
    torch: str
    metric: str
    baseline: float
    batch_size: int
    threads: int
    rows: list[RecoveryRow]
    note: NotRequired[str]


def describe_prune(prune: dict[str, object]) -> str:
    """``depth 0.17``, ``FFN 0.25``, ``heads 0.25`` or ``heads+FFN 0.3`` for a prune config dict."""
    if prune.get("method") == "depth":
        return f"depth {prune['ratio']}"
    heads, ffn = prune.get("head_ratio"), prune.get("ffn_ratio")
    if heads == 0.0:
        return f"FFN {ffn}"
    if ffn == 0.0:
        return f"heads {heads}"
    return f"heads+FFN {prune['ratio']}"


def render(result: RecoveryResult) -> str:
    """A Markdown table of one recovery file: per prune, the metric after each distillation run."""
    lines = [
        f"### Recovery by distillation: {result['model']} on {result['device']}",
        "",
        f"`python -m paretorch.experiments.bench.recovery` ({result.get('note', DEFAULT_NOTE)}); unpruned "
        f"{result['metric']} {result['baseline']:.4f}, distillation batch {result['batch_size']}.",
        "",
        f"| prune | distill steps | lr | hidden layers matched | {result['metric']} | drop | distill s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        lr = f"{row['lr']:g}" if row.get("steps") else "-"
        lines.append(f"| {describe_prune(row['prune'])} | {row['steps']} | {lr} | {row.get('hidden_layers', 0)} "
                     f"| {row['metric']:.4f} | {row['drop']:+.4f} | {row['seconds']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--prune", nargs="+", type=prune_config, required=True, metavar="KIND:RATIO")
    parser.add_argument("--steps", nargs="+", type=int, default=[0, 300, 1000])
    parser.add_argument("--lr", nargs="+", type=float, default=[1e-4])
    parser.add_argument("--hidden", action="store_true",
                        help="also match the outputs of every transformer layer the student kept (same name)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("experiments/bench/results"))
    args = parser.parse_args(argv)

    spec = resolve_spec(args.model)
    device = resolve_device(args.device)
    model = load_model(spec)
    baseline = metric_of(model, spec, device)
    rows: list[RecoveryRow] = []
    for prune in args.prune:
        ctx = StageContext(spec, device)
        pruned = transform(model, prune, ctx).cpu()
        layer_map = same_name_layers(pruned, model) if args.hidden else ()
        runs = [(0, 0.0)] if 0 in args.steps else []
        runs += [(steps, lr) for steps in args.steps if steps for lr in args.lr]
        for steps, lr in runs:
            distilled, seconds, passes = pruned, 0.0, 0
            if steps:
                dctx = StageContext(spec, device, source_model=model)
                config = DistillConfig(steps=steps, lr=lr, batch_size=args.batch_size, layer_map=layer_map)
                start = host_seconds()
                distilled = transform(pruned, config, dctx)
                seconds, passes = host_seconds() - start, int(dctx.records["distill.teacher_passes"])
            value = metric_of(distilled, spec, device)
            row: RecoveryRow = {"prune": prune.to_dict(), "steps": steps, "lr": lr, "hidden_layers": len(layer_map),
                                "metric": value, "drop": baseline - value, "seconds": round(seconds, 2),
                                "teacher_passes": passes}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "prune"} | {"prune": str(prune.to_dict())[:90]}),
                  flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{RECOVERY_PREFIX}{spec.name}-{device.type}.json"
    result: RecoveryResult = {
        "model": spec.name, "device": device.type, "host": platform.node(), "torch": torch.__version__,
        "metric": spec.metric.name, "baseline": baseline, "batch_size": args.batch_size,
        "threads": torch.get_num_threads(), "rows": rows,
    }
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
