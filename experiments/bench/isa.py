"""Which instruction set a benchmark ran on: the CPU's flags, and any cap that emulates a narrower CPU."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import NotRequired, TypedDict

import torch

from paretorch.pipeline.core.device import cpu_flags

#: The variables that make a wider CPU run as an AVX2-only one, and what each reaches.
ISA_CAPS = {"ATEN_CPU_CAPABILITY": "torch's aten kernels (and the matmuls torch.compile calls)",
            "MKL_ENABLE_INSTRUCTIONS": "MKL (torch's float32 GEMMs)",
            "ONEDNN_MAX_CPU_ISA": "oneDNN: torch's (PT2E int8 through it) and the one inside OpenVINO's CPU plugin "
                                  "(its FullyConnected, MatMul, int8 and Softmax nodes)"}


class IsaInfo(TypedDict):
    """What :func:`isa_info` records: the flags, torch's capability, the caps set, and (capped) what they reach."""

    flags: list[str]
    torch_capability: str
    caps: dict[str, str]
    #: The emulated instruction set, lower case (None: none).
    emulated: str | None
    reaches: NotRequired[list[str]]
    not_reached: NotRequired[list[str]]


def isa_info() -> IsaInfo:
    """This CPU's instruction-set flags and any emulated cap (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``): a
    row measured under a cap says what the cap does not reach (ONNX Runtime's MLAS, and OpenVINO's own MLAS GEMMs
    and MVN kernels, dispatch on the real CPU)."""
    flags = cpu_flags()
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
    caps = {name: os.environ[name] for name in ISA_CAPS if os.environ.get(name)}
    info: IsaInfo = {"flags": [f for f in wanted if f in flags], "torch_capability":
                     torch.backends.cpu.get_cpu_capability(), "caps": caps, "emulated": None}
    if caps:
        named = caps.get("ATEN_CPU_CAPABILITY", caps.get("ONEDNN_MAX_CPU_ISA", caps.get("MKL_ENABLE_INSTRUCTIONS")))
        info["emulated"] = str(named).lower()
        info["reaches"] = [ISA_CAPS[name] for name in caps]
        info["not_reached"] = ["ONNX Runtime (MLAS dispatches on the real CPU)",
                               "OpenVINO's MLAS GEMMs and MVN kernels (no ISA cap in release builds)"]
    return info


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name and the instruction sets the peers choose by (AMX, AVX512-BF16, VNNI, AVX2)."""
    if not cpuinfo.is_file():
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in cpuinfo.read_text().splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    present = [f for f in ("amx_bf16", "avx512_bf16", "avx512_vnni", "avx2") if f in flags]
    return f"{fields.get('model name', platform.machine())} ({', '.join(present) or 'none of AMX/AVX-512/AVX2'}" \
           + ("; no AMX)" if "amx_bf16" not in flags else ")")
