"""Devices and what each one can do: the one place that knows device kinds.

Stages, the evaluator and the search read :class:`Capabilities`; nothing else
branches on ``device.type``. Memory goes through ``torch.accelerator`` so that MPS and CUDA
share one path and the CPU path differs only in its memory source; timing (each device's one
clock: events on an accelerator, the host clock on the CPU) is the timing service's
(:mod:`paretorch.pipeline.core.timing`).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from paretorch.pipeline.core.errors import DeviceError, InfeasibleConfig
from paretorch.pipeline.core.names import AUTO_ORDER, device_name
from paretorch.pipeline.core.ov_core import shared_core
from paretorch.pipeline.core.paths import results_dir
from paretorch.pipeline.core.timing import BlockTimer, Timed, time_rounds


@dataclass(frozen=True)
class Capabilities:
    """What one device can run, and what is worth running there."""

    kind: str
    #: Reduced floating dtypes that run at all.
    reduced_dtypes: tuple[torch.dtype, ...]
    #: Reduced dtypes that are expected to be faster than fp32 (measured in STACK.md).
    fast_dtypes: tuple[torch.dtype, ...]
    #: Reduced dtypes under which training (forward and backward under autocast) is faster
    #: than fp32: distillation autocasts to the first one, else trains in fp32.
    training_dtypes: tuple[torch.dtype, ...] = ()
    #: CUDA compute capability (major, minor); None elsewhere. Quantization methods read it
    #: (float8 needs >= 8.9); which method runs where is the quantize stage's method table.
    cuda_capability: tuple[int, int] | None = None
    compile: bool = True
    cuda_graphs: bool = False
    #: Core ML predictions can be made (macOS only).
    coreml_predict: bool = False
    #: ONNX Runtime execution providers of the installed onnxruntime that run on this device, in
    #: onnxruntime's priority order (:data:`ORT_PROVIDERS`); empty: the onnxruntime runtime is unavailable.
    ort_providers: tuple[str, ...] = ()
    #: OpenVINO devices of the installed openvino that run on this torch device (:data:`OV_DEVICES`);
    #: empty: the openvino runtime is unavailable.
    ov_devices: tuple[str, ...] = ()

    def preferred_reduced_dtype(self) -> torch.dtype | None:
        """The reduced dtype to try first: the first fast one, else the first available."""
        if self.fast_dtypes:
            return self.fast_dtypes[0]
        return self.reduced_dtypes[0] if self.reduced_dtypes else None

    def require_dtype(self, dtype: torch.dtype) -> None:
        """Raise :class:`InfeasibleConfig` if ``dtype`` cannot run here."""
        if dtype not in self.reduced_dtypes and dtype != torch.float32:
            raise InfeasibleConfig(f"{dtype} is not supported on {self.kind}")


#: ONNX Runtime execution providers the table knows: provider -> (device kind it runs on, None when
#: verified on these machines, else why it is not yet). Providers of other kinds (Azure, ...) are not devices.
ORT_PROVIDERS: dict[str, tuple[str, str | None]] = {
    "CPUExecutionProvider": ("cpu", None),
    "CUDAExecutionProvider": ("cuda", "unverified: needs the onnxruntime-gpu build, not installed on these machines"),
    "TensorrtExecutionProvider": ("cuda", "unverified: needs onnxruntime-gpu with TensorRT, not installed here"),
    "CoreMLExecutionProvider": ("mps", "unverified: not yet run on a Mac"),
}


def ort_provider_note(provider: str) -> str | None:
    """Why ``provider`` is not verified on these machines (None when it is, or is not in the table)."""
    return ORT_PROVIDERS.get(provider, ("", None))[1]


def installed_ort_providers(kind: str) -> tuple[str, ...]:
    """Execution providers of the installed onnxruntime that run on device ``kind`` (none without onnxruntime)."""
    try:
        import onnxruntime
    except ImportError:  # onnxruntime is a pinned dependency; a trimmed install just has no such runtime
        return ()
    return tuple(p for p in onnxruntime.get_available_providers() if ORT_PROVIDERS.get(p, ("", None))[0] == kind)


#: OpenVINO devices the table knows: device -> (torch device kind it serves, None when verified on these
#: machines, else why not yet). OpenVINO's GPU and NPU are Intel devices torch has no device for: listed, never used.
OV_DEVICES: dict[str, tuple[str | None, str | None]] = {
    "CPU": ("cpu", None),
    "GPU": (None, "unverified: an Intel GPU, not a torch device (not present on these machines)"),
    "NPU": (None, "unverified: an Intel NPU, not a torch device (not present on these machines)"),
}
#: The CPU plugin on Apple silicon (OpenVINO's ARM CPU plugin) has not run on these machines.
OV_ARM_CPU_NOTE = "unverified: OpenVINO's ARM CPU plugin, not yet run on a Mac"


def ov_device_note(device: str) -> str | None:
    """Why OpenVINO ``device`` is not verified on these machines (None when it is)."""
    base = device.split(".")[0]
    if base == "CPU" and platform.system() == "Darwin" and platform.machine() == "arm64":
        return OV_ARM_CPU_NOTE
    return OV_DEVICES.get(base, (None, "unverified: a device this table does not know"))[1]


def openvino_devices() -> tuple[str, ...]:
    """The devices of the installed openvino (``available_devices`` of the process's one ``Core``; none
    without openvino)."""
    try:
        core = shared_core()
    except ImportError:  # openvino is a pinned dependency; a trimmed install just has no such runtime
        return ()
    return tuple(core.available_devices)


def installed_ov_devices(kind: str) -> tuple[str, ...]:
    """OpenVINO devices of the installed openvino that run on torch device ``kind`` (CPU -> cpu)."""
    return tuple(d for d in openvino_devices() if OV_DEVICES.get(d.split(".")[0], (None, None))[0] == kind)


def available_kinds() -> list[str]:
    """Device kinds present on this machine, in ``auto`` order."""
    kinds = []
    if torch.backends.mps.is_available():
        kinds.append("mps")
    if torch.cuda.is_available():
        kinds.append("cuda")
    kinds.append("cpu")
    return kinds


def resolve_device(name: str = "auto") -> torch.device:
    """``auto|mps|cuda|cpu`` -> a torch.device; an absent device is a :class:`DeviceError`."""
    name = device_name(name)
    present = available_kinds()
    if name == "auto":
        name = next(kind for kind in AUTO_ORDER if kind in present)
    elif name not in present:
        raise DeviceError(f"device '{name}' is not available here (available: {', '.join(present)}); use --device auto")
    return torch.device(name)


@cache
def capabilities(device: torch.device) -> Capabilities:
    """The capability table row for ``device`` (probed once per process)."""
    kind = device.type
    if kind == "cuda":
        return _cuda_capabilities()
    if kind == "mps":
        return _mps_capabilities()
    if kind == "cpu":
        return _cpu_capabilities()
    raise DeviceError(f"no capability table for device type '{kind}'")


#: bf16 counts as fast on a CPU when the probe's matmul under autocast takes at most this share
#: of its float32 time. Measured on one thread: an avx512_bf16 Xeon without AMX 1.6x *slower*
#: (62.7 vs 38.5 ms, Linear 384->1536 on 4096 rows), another host of this workplace 2.8x faster
#: (MiniLM); the CPU flags alone do not tell them apart.
CPU_FAST_RATIO = 0.8
#: ``fast`` or ``slow`` skips the probe (a CPU the user knows; reproducible tests); unset: measured.
CPU_BF16_ENV_VAR = "PARETORCH_CPU_BF16"


def autocast_time_ratio(dtype: torch.dtype, features: int = 512, rows: int = 256, repeats: int = 9) -> float:
    """Time of a Linear under CPU autocast to ``dtype`` over its float32 time: ``repeats`` paired rounds on the
    timing service (a block of 4 calls a side, warmed by 4 calls each, the order alternating), the median of the
    per-round ratios, so a busy period slows both sides of a round alike."""
    layer = torch.nn.Linear(features, features)
    inputs = torch.randn(rows, features)

    def under(enabled: bool) -> Callable[[], object]:
        def call() -> object:
            with torch.autocast("cpu", dtype=dtype, enabled=enabled):
                return layer(inputs)
        return call

    sides: list[Timed] = [(under(True), ()), (under(False), ())]
    timer = BlockTimer(torch.device("cpu"), calls=4, warm_calls=4)  # warm: oneDNN primitives for both dtypes
    timer.warm_up(sides)
    autocast, float32 = time_rounds(sides, timer, repeats)
    return statistics.median(a / f for a, f in zip(autocast, float32, strict=True))


#: The file under ``<results>/cache`` that keeps facts measured once per host (CPU model and torch version).
HOST_FACTS_FILE = "host-facts.json"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else the platform's processor string)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


@cache
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """This CPU's instruction-set flags (``/proc/cpuinfo``'s first ``flags`` line, read once; empty where none)."""
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    return frozenset()


#: x86 instruction sets with an int8 dot product that accumulates u8 x s8 in int32 (no int16 step).
INT8_DOT_PRODUCT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def int8_products_saturate(flags: frozenset[str] | None = None, machine: str | None = None) -> bool:
    """Whether ONNX Runtime's u8 x s8 kernels (MLAS) saturate here: an x86 CPU without VNNI or AMX adds pairs of
    products in int16 (``vpmaddubsw``), which full 8-bit weights overflow. On an AVX2-only AMD EPYC (Zen 3) that
    turned all-mpnet-base-v2's dynamic int8 into noise (cosine to fp32 0.02); onnxruntime's ``reduce_range``
    (7-bit weights) brought it to 0.92, the VNNI machine's level. Arm and VNNI CPUs do not saturate."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64", "i386", "i686"):
        return False
    flags = cpu_flags() if flags is None else flags
    return bool(flags) and not any(flag in flags for flag in INT8_DOT_PRODUCT_FLAGS)


def host_facts_file() -> Path:
    return results_dir() / "cache" / HOST_FACTS_FILE


def host_fact(name: str, measure: Callable[[], object]) -> object:
    """A fact about this host (CPU model + torch version) measured once and kept in :func:`host_facts_file`,
    so that runs agree with each other; ``measure`` runs when no run stored it yet."""
    path = host_facts_file()
    key = f"{cpu_model()} | torch {torch.__version__}"
    try:
        facts = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        facts = {}
    known = facts.get(key, {})
    if name in known:
        return known[name]
    value = measure()
    facts.setdefault(key, {})[name] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(facts, indent=2, sort_keys=True))
    except OSError:  # a read-only results directory: measured again next time
        pass
    return value


def cpu_bf16_is_fast() -> bool:
    """Whether bf16 runs faster than float32 on this CPU: oneDNN supports it, and a probe matmul
    under autocast takes at most :data:`CPU_FAST_RATIO` of the float32 time (paired rounds, about
    0.2 s), unless ``$PARETORCH_CPU_BF16`` says ``fast`` or ``slow``. Decided once per host and kept
    (:func:`host_fact`): a probe on a loaded machine could otherwise decide differently from run to run."""
    forced = os.environ.get(CPU_BF16_ENV_VAR, "").strip().lower()
    if forced in ("fast", "slow"):
        return forced == "fast"
    if forced:
        raise DeviceError(f"{CPU_BF16_ENV_VAR}={forced}: set it to fast or slow, or unset it to measure")
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    return bool(host_fact("cpu_bf16_fast", lambda: autocast_time_ratio(torch.bfloat16) <= CPU_FAST_RATIO))


def _cpu_capabilities() -> Capabilities:
    return Capabilities(
        kind="cpu",
        reduced_dtypes=(torch.bfloat16, torch.float16),
        # fp16 runs on CPU but was ~6x slower than fp32 (STACK.md); bf16 is measured.
        fast_dtypes=(torch.bfloat16,) if cpu_bf16_is_fast() else (),
        # bf16 autocast *training* was 1.8x slower than fp32 on an avx512_bf16 Xeon (MiniLM,
        # batch 32, seq 64: 2.9 s vs 1.6 s per step; STACK.md): inference-fast is not training-fast.
        training_dtypes=(),
        compile=True,
        cuda_graphs=False,
        coreml_predict=platform.system() == "Darwin",
        ort_providers=installed_ort_providers("cpu"),
        ov_devices=installed_ov_devices("cpu"),
    )


def _cuda_capabilities() -> Capabilities:
    major, minor = torch.cuda.get_device_capability()
    reduced = (torch.bfloat16, torch.float16) if torch.cuda.is_bf16_supported() else (torch.float16,)
    return Capabilities(
        kind="cuda",
        reduced_dtypes=reduced,
        fast_dtypes=reduced,
        training_dtypes=reduced,
        cuda_capability=(major, minor),
        compile=True,
        cuda_graphs=True,
        ort_providers=installed_ort_providers("cuda"),
    )


def _mps_capabilities() -> Capabilities:
    mac_version = tuple(int(p) for p in (platform.mac_ver()[0] or "0").split(".")[:2])
    bf16 = mac_version >= (14, 0)
    return Capabilities(
        kind="mps",
        # fp16 is the fast path on Apple GPUs; bf16 needs macOS 14+.
        reduced_dtypes=(torch.float16, torch.bfloat16) if bf16 else (torch.float16,),
        fast_dtypes=(torch.float16,),
        # Autocast training on MPS (fp16 with a GradScaler) is unverified without a Mac: fp32.
        training_dtypes=(),
        compile=True,
        cuda_graphs=False,
        coreml_predict=True,
        ort_providers=installed_ort_providers("mps"),
    )


def on_device(tensor: torch.Tensor, device: torch.device) -> bool:
    """Whether ``tensor`` lives on ``device`` ("cuda" matches "cuda:0"; an index must match)."""
    return tensor.device.type == device.type and (device.index is None or tensor.device.index == device.index)


def move_module(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` on ``device``, moved only when some parameter or buffer is elsewhere.

    ``Module.to`` swaps tensor-subclass parameters (torchao's quantized weights) even
    when nothing moves, and the swap fails once ``torch.compile`` holds a weak reference
    to them (a cached model compiled in an earlier trial): skipping the no-op move keeps
    such a model reusable."""
    tensors = [*model.parameters(), *model.buffers()]
    if all(on_device(t, device) for t in tensors):
        return model
    return model.to(device)


# --------------------------------------------------------------------------- memory


_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window (device allocator, or process RSS on the CPU)."""
    if device.type != "cpu":
        torch.accelerator.reset_peak_memory_stats()
    elif _CLEAR_REFS.exists():
        # Writing 5 resets the kernel's peak-RSS mark (VmHWM) for this process.
        _CLEAR_REFS.write_text("5")


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory since :func:`reset_peak_memory`: allocator bytes on accelerators,
    peak resident set size of the process on the CPU."""
    if device.type != "cpu":
        return int(torch.accelerator.max_memory_allocated())
    if _STATUS.exists():
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    scale = 1 if platform.system() == "Darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def describe(device: torch.device) -> str:
    """A short human description: 'cuda (NVIDIA H100, sm 9.0)', 'cpu (AVX512, 2 threads)'."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability()
        return f"cuda ({torch.cuda.get_device_name()}, sm {major}.{minor})"
    if device.type == "mps":
        return f"mps (macOS {platform.mac_ver()[0]})"
    return f"cpu ({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"
