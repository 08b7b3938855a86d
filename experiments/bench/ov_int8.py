"""OpenVINO static int8: our IR (the ``export.openvino`` stage's NNCF mirror of ``int8_static_pt2e``) against the
peer's (sentence-transformers' OpenVINO backend + optimum-intel / NNCF static int8), side by side.

    taskset -c 1 python -m paretorch.experiments.bench.ov_int8 --peer-ir PEER.xml [--ours DIR] [--budget normal]

The peer's IR is made in the peer's own environment, the way :mod:`paretorch.experiments.bench.peers_runner` makes it
(``quantize_openvino``: OVQuantizer + NNCF on the spec's 64 calibration sentences); e.g. the
``openvino/openvino_model_qint8_quantized.xml`` that ``python -m paretorch.experiments.bench.peers`` leaves in its work
directory. Ours is exported here (MiniLM, ``int8_static_pt2e`` mirrored), or read from ``--ours``.

It prints each IR's structure (FakeQuantize ops, MatMuls int8 / float, the NNCF parameters recorded in the IR's
``rt_info``) and times each IR under two compile settings, each paired with torch fp32 eager in this one
process (:func:`paretorch.pipeline.core.paired.measure_paired`, alternating rounds, median of the per-round ratios with
its 95% interval), on the spec's latency batch: ``ov_session`` (what the ``openvino`` runtime compiles:
:func:`paretorch.pipeline.core.ov_session.open_ir`) and the peer's (threads and one stream set, the precision left to
OpenVINO). The peer's IR outputs token embeddings; its rows pool them as sentence-transformers does (mean over
the mask, then L2 norm) in torch, inside the timed call.

AVX2 emulation on an AVX-512 CPU (label the rows: the script records the variables): set
``ATEN_CPU_CAPABILITY=avx2`` (torch's kernels), ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (torch's fp32 GEMMs) and
``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN: torch's and the one inside OpenVINO's CPU plugin) before the process
starts. OpenVINO's CPU plugin has no release-build ISA cap of its own (``OV_CPU_MAX_ISA`` exists only in
debug-caps builds): its capability list and its default precision still come from CPUID (bf16 here, which then
fails to compile under the oneDNN cap), so under the emulation every row runs with ``f32``: what OpenVINO picks,
and what our export records, on a real AVX2 CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from paretorch.experiments.bench.isa import cpu_description
from paretorch.experiments.models import minilm

if TYPE_CHECKING:
    import openvino
from paretorch.pipeline.core.latency import LATENCY_BUDGETS
from paretorch.pipeline.core.names import DEFAULT_LATENCY_BUDGET
from paretorch.pipeline.core.ov_core import shared_core
from paretorch.pipeline.core.ov_session import InferencePrecision, OvModel, open_ir
from paretorch.pipeline.core.padding import latency_inputs
from paretorch.pipeline.core.paired import measure_paired
from paretorch.pipeline.core.stage import ExportResult, StageContext, apply_stage
from paretorch.pipeline.core.timing import DeviceTimer, process_clock
from paretorch.stages.export.openvino import OpenVINOExportConfig
from paretorch.stages.export.openvino_nncf import count_int8, matmul_precision
from paretorch.stages.quantize.stage import QuantizeConfig

CPU = torch.device("cpu")
#: The variables of the AVX2 emulation, recorded with every result.
EMULATION_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
#: The NNCF parameters the IR's ``rt_info`` records (``nncf/quantization/...``).
NNCF_KEYS = ("model_type", "preset", "subset_size", "target_device", "fast_bias_correction", "ignored_scope")
OV_INT8_PREFIX = "ov-int8-"


def emulated() -> dict[str, str]:
    """The emulation variables set in this process."""
    return {name: os.environ[name] for name in EMULATION_VARS if os.environ.get(name)}


def _rt(model: openvino.Model, path: list[str]) -> str | None:
    return str(model.get_rt_info(path).astype(str)) if model.has_rt_info(path) else None


def ir_facts(xml: Path) -> dict[str, object]:
    """What NNCF did to the IR at ``xml``: op counts, MatMuls by precision, the recorded NNCF parameters."""
    model = shared_core().read_model(str(xml))
    fake_quantize, int8_constants = count_int8(model)
    matmuls = matmul_precision(model)
    advanced = _rt(model, ["nncf", "quantization", "advanced_parameters"]) or ""
    overflow = "disable" if "'overflow_fix': 'disable'" in advanced else (
        "default (first layer)" if advanced in ("", "{}") else advanced[:80])
    return {
        "inputs": [inp.get_any_name() for inp in model.inputs],
        "output": str(model.outputs[0].get_partial_shape()),
        "fake_quantize": fake_quantize, "int8_constants": int8_constants,
        "matmul_int8": matmuls.int8, "matmul_weight_only": len(matmuls.weight_only),
        "matmul_float": len(matmuls.float),
        "sdpa": sum(op.get_type_name() == "ScaledDotProductAttention" for op in model.get_ops()),
        "nncf": {key: _rt(model, ["nncf", "quantization", key]) for key in NNCF_KEYS},
        "overflow_fix": overflow,
    }


def export_ours(out: Path) -> Path:
    """Our IR of MiniLM: the ``export.openvino`` stage with ``int8_static_pt2e`` upstream (default config)."""
    spec = minilm.spec()
    model = spec.build()
    ctx = StageContext(spec, CPU, output_dir=out, upstream=(QuantizeConfig(method="int8_static_pt2e"),),
                       float_model=model)
    result = apply_stage(model, OpenVINOExportConfig(measure_latency=False), ctx)
    if not isinstance(result, ExportResult):
        raise TypeError(f"export.openvino gave a {type(result).__name__}, not its export result")
    print(f"ours: {result.validation}", flush=True)
    return Path(result.path) / f"{spec.name}.xml"


class PlainIr:
    """An IR compiled the peer's way (threads, one stream; the precision OpenVINO's unless given), called with
    (input_ids, attention_mask); token outputs are pooled as sentence-transformers pools them."""

    def __init__(self, xml: Path, threads: int, precision: str | None) -> None:
        config = {"INFERENCE_NUM_THREADS": str(threads), "NUM_STREAMS": "1"}
        if precision is not None:
            config["INFERENCE_PRECISION_HINT"] = precision
        self.compiled = shared_core().compile_model(str(xml), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.names = [inp.get_any_name() for inp in self.compiled.inputs]
        self.precision = str(self.compiled.get_property("INFERENCE_PRECISION_HINT"))

    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        given = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
        feed = {name: given.get(name, np.zeros_like(given["input_ids"])) for name in self.names}
        out = torch.from_numpy(np.array(self.request.infer(feed)[0], dtype=np.float32, copy=True))
        if out.dim() == 2:
            return out
        mask = attention_mask.unsqueeze(-1).to(out.dtype)
        pooled = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=1)


def rows(ours: Path, peer: Path | None, threads: int, budget: str) -> list[dict[str, object]]:
    """Each IR under each compile setting, paired with torch fp32 eager."""
    spec = minilm.spec()
    baseline = spec.build()
    inputs = latency_inputs(spec, 32, "openvino")[0]
    settings = LATENCY_BUDGETS[budget]
    timer = DeviceTimer(CPU, settings)
    # Under the emulation OpenVINO still picks bf16 (from CPUID), which does not compile under the oneDNN cap: f32 is
    # what it picks, and what our export records, on a real AVX2 CPU.
    default_precision: InferencePrecision | None = "f32" if os.environ.get("ONEDNN_MAX_CPU_ISA") else None
    candidates: list[tuple[str, Path, Callable[[], OvModel | PlainIr]]] = [
        ("ours, ov_session", ours, lambda: open_ir(ours, CPU, threads, default_precision))]
    candidates.append(("ours, peer's compile", ours, lambda: PlainIr(ours, threads, default_precision)))
    if peer is not None:
        candidates.append(("peer, peer's compile", peer, lambda: PlainIr(peer, threads, default_precision)))
        candidates.append(("peer, f32 hint", peer, lambda: PlainIr(peer, threads, "f32")))
    found: list[dict[str, object]] = []
    with torch.no_grad():
        reference = baseline(*inputs)
    for name, xml, make in candidates:
        fn = make()
        how = f"threads {threads}, 1 stream, {fn.precision}" if isinstance(fn, PlainIr) else fn.describe()
        with torch.no_grad():
            cosine = float(torch.nn.functional.cosine_similarity(fn(*inputs), reference).min())
        paired = measure_paired((baseline, inputs), (fn, inputs), timer, settings, cpu_clock=process_clock)
        row = {"name": name, "ir": str(xml), "compile": how, "speedup": paired.speedup, "ci": list(paired.ci),
               "trial_ms": paired.trial_ms, "baseline_ms": paired.baseline_ms, "rounds": paired.rounds,
               "min_cosine_vs_torch": cosine, "machine": paired.machine.describe(), "unstable": paired.unstable}
        print(f"{name}: {paired.speedup:.2f}x [{paired.ci[0]:.2f}, {paired.ci[1]:.2f}] vs torch fp32 eager "
              f"({paired.trial_ms:.1f} vs {paired.baseline_ms:.1f} ms), {how}; min cosine {cosine:.4f}; "
              f"{paired.machine.describe()}", flush=True)
        found.append(row)
    return found


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paretorch.experiments.bench.ov_int8",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-ir", type=Path, help="the peer's int8 IR (.xml), made in its own environment")
    parser.add_argument("--ours", type=Path, help="our IR (.xml or the export's directory); default: export it")
    parser.add_argument("--work", type=Path, default=Path("runs/bench/ov-int8"), help="where our IR is exported")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", choices=sorted(LATENCY_BUDGETS), default=DEFAULT_LATENCY_BUDGET)
    parser.add_argument("--out", type=Path, default=Path("runs/bench"),
                        help="where the JSON goes (not the rendered results folder: no BENCHMARKS.md section reads it)")
    args = parser.parse_args(argv)
    if args.peer_ir is not None and not args.peer_ir.is_file():
        parser.error(f"--peer-ir {args.peer_ir} is no file: make it with python -m paretorch.experiments.bench.peers")
    torch.set_num_threads(args.threads)
    before = _uptime()
    ours = args.ours or export_ours(args.work)
    if ours.is_dir():
        ours = next(ours.glob("*.xml"))
    facts = {"ours": ir_facts(ours), **({"peer": ir_facts(args.peer_ir)} if args.peer_ir else {})}
    for name, fact in facts.items():
        print(f"{name} IR: {json.dumps(fact)}", flush=True)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print(f"{cpu_description()}; emulation {emulated() or 'none'}; threads {args.threads}; affinity {affinity}; "
          f"{before}", flush=True)
    measured = rows(ours, args.peer_ir, args.threads, args.budget)
    result = {"cpu": cpu_description(), "emulation": emulated(), "threads": args.threads, "affinity": affinity,
              "budget": args.budget, "uptime_before": before, "uptime_after": _uptime(),
              "openvino": metadata.version("openvino"), "torch": torch.__version__, "python": platform.python_version(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "ir": facts, "rows": measured}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{OV_INT8_PREFIX}minilm-{'avx2-emulated' if emulated() else 'native'}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
