"""One number between search and bench: a pack recipe timed the search's way and ``gpu_rows``' way.

    python -m paretorch.experiments.bench.pack_agreement --recipe pack+bf16 --batch 32 --runtime compile --threads 1
        [--out F]

The search times a trial with :class:`~paretorch.pipeline.search.study_latency.StudyLatency` (the study's runner over
the default pipeline; each runtime on its ``latency_inputs``: a static-shape runtime on the batch padded to
its width bucket); :mod:`paretorch.experiments.bench.gpu_rows` times its rows on the batch cut to its longest sample.
Both pair with fp32 eager at the batch's longest sample under the bench's latency budget. A packed model
runs the same token bucket and attention width on both inputs, so the two speed-ups should agree within
their 95 % intervals (``intervals_overlap``); an unpacked model under a static-shape runtime would not (it
pays the width bucket in the search only). Its own module: the search's imports (Optuna) stay out of
``gpu_rows``, which runs on machines without them.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TypedDict

import torch

from paretorch.experiments.bench.gpu_rows import FULL_BF16
from paretorch.experiments.bench.settings import BENCH_LATENCY
from paretorch.experiments.models.minilm import spec as minilm_spec
from paretorch.pipeline.core.padding import latency_sample, trim_to_longest
from paretorch.pipeline.core.paired import PairedLatency, measure_paired
from paretorch.pipeline.core.spec import move_batch
from paretorch.pipeline.core.stage import StageConfig
from paretorch.pipeline.core.timing import DeviceTimer
from paretorch.pipeline.engine.graph import default_pipeline
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.search.study_latency import StudyLatency
from paretorch.stages.pack.stage import PackConfig
from paretorch.stages.quantize.stage import QuantizeConfig


class PairedTiming(TypedDict):
    speedup: float
    ci: list[float]
    trial_ms: float
    baseline_ms: float


class PackAgreement(TypedDict):
    """A ``pack-agreement-*.json`` file: the recipe, the widths each way timed, both pairings, whether they agree."""

    batch: int
    runtime: str
    recipe: list[dict[str, object]]
    searched_width: int
    benched_width: int
    load_before: tuple[float, float, float]
    threads: int
    search: PairedTiming
    gpu_rows: PairedTiming
    intervals_overlap: bool
    load_after: tuple[float, float, float]


RECIPES: dict[str, list[StageConfig]] = {
    "pack": [PackConfig()],
    "pack+bf16": [PackConfig(), FULL_BF16],
    "pack+int8": [PackConfig(), QuantizeConfig(method="int8_dynamic")],
}


def _timing(paired: PairedLatency) -> PairedTiming:
    return {"speedup": paired.speedup, "ci": list(paired.ci), "trial_ms": paired.trial_ms,
            "baseline_ms": paired.baseline_ms}


def agreement(device: torch.device, batch: int, runtime: str, configs: list[StageConfig]) -> PackAgreement:
    """One recipe timed the search's way (:class:`~paretorch.pipeline.search.study_latency.StudyLatency`: the study's
    runner over the default pipeline, the runtime's ``latency_inputs``) and the rows' way (:func:`run`: the
    batch cut to its longest sample), each paired with fp32 eager, both with the bench's latency budget: the
    two speed-ups and their 95 % intervals, which should overlap (one number between search and bench)."""
    spec = minilm_spec()
    mask = spec.padding_mask
    assert mask is not None
    runner = Runner(default_pipeline(exports=()), spec, device, latency=BENCH_LATENCY)
    by_node = {config.stage: config for config in configs}
    study = StudyLatency(spec, device, batch, lambda: runner, BENCH_LATENCY)
    fn = study.function(by_node, runtime)
    searched = study.inputs(runtime)
    benched = move_batch(trim_to_longest(latency_sample(spec, batch), mask), device)
    timer = DeviceTimer(device, BENCH_LATENCY)
    load_before = os.getloadavg()
    with torch.no_grad():
        for _ in range(3):
            fn(*searched), fn(*benched)
        search = study.pair(fn, runtime)
        rows = measure_paired((study.baseline(), benched), (fn, benched), timer, BENCH_LATENCY)
    return {"batch": batch, "runtime": runtime, "recipe": [c.to_dict() for c in configs],
            "searched_width": int(searched[mask].shape[1]), "benched_width": int(benched[mask].shape[1]),
            "load_before": load_before, "threads": torch.get_num_threads(), "search": _timing(search),
            "gpu_rows": _timing(rows), "intervals_overlap": search.ci[0] <= rows.ci[1] and rows.ci[0] <= search.ci[1],
            "load_after": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="pack+bf16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runtime", default="compile")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    found = agreement(torch.device(args.device), args.batch, args.runtime, RECIPES[args.recipe])
    text = json.dumps(found, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


#: Result files of this benchmark start with this (``pack-agreement-minilm-cpu-b32.json``).
PACK_AGREEMENT_PREFIX = "pack-agreement-"


def render(result: PackAgreement) -> str:
    """BENCHMARKS.md: the same pack recipe timed the search's way and ``gpu_rows``' way."""
    recipe = " + ".join(str(stage["stage"]) if stage["stage"] == "pack" else str(stage.get("method", stage["stage"]))
                        for stage in result["recipe"])
    lines = [f"### One number between search and bench: {recipe} | {result['runtime']}, batch {result['batch']}",
             "", f"{result['threads']} thread(s); 1-minute load before {result['load_before'][0]:.1f}, after "
             f"{result['load_after'][0]:.1f}. Intervals overlap: {'yes' if result['intervals_overlap'] else 'NO'}.",
             "", "| timed as | width | speed-up [95% CI] | trial ms | fp32 eager ms |",
             "| --- | --- | --- | --- | --- |"]
    for key, width, row in (("search", result["searched_width"], result["search"]),
                            ("gpu_rows", result["benched_width"], result["gpu_rows"])):
        lines.append(f"| {key} | {width} | {row['speedup']:.2f}x [{row['ci'][0]:.2f}, {row['ci'][1]:.2f}] | "
                     f"{row['trial_ms']:.1f} | {row['baseline_ms']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
