"""An OpenVINO IR run like a torch model: ``model(*tensors) -> first output``.

The one place that compiles OpenVINO models, so the ``openvino`` runtime and the OpenVINO export's own
check run an IR alike: the device's first OpenVINO device from the capability table
(:data:`paretorch.pipeline.core.device.OV_DEVICES`), dynamic input shapes as the IR declares them, as many
inference threads as torch uses (``INFERENCE_NUM_THREADS = torch.get_num_threads()``), one stream,
the LATENCY hint, threads not pinned to cores (the torch model timed in the same rounds keeps its CPU),
and the inference precision the export recorded (``f32`` or ``bf16``; OpenVINO's own default is bf16
on CPUs with AVX512-BF16 or AMX and f32 on AVX2-only ones, so it is always set; the export asks
:func:`default_precision` where the recipe leaves it to OpenVINO). Torch tensors go in through numpy and
come back as float32 tensors (copies, never views of OpenVINO's output buffers) on the caller's device.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from paretorch.pipeline.core.device import capabilities, ov_device_note
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.ov_core import shared_core
from paretorch.pipeline.core.spec import Batch

if TYPE_CHECKING:
    import openvino

InferencePrecision = Literal["f32", "bf16"]
#: OpenVINO's names of the precisions (``INFERENCE_PRECISION_HINT``) and the plugin capability each needs.
PRECISION_CAPABILITY: dict[str, str] = {"f32": "FP32", "bf16": "BF16"}
#: The IR's ``rt_info`` section where the export records how it must be compiled.
RT_INFO_SECTION = "paretorch"
#: Longest OpenVINO message quoted in a reason.
MAX_MESSAGE_CHARS = 300


@dataclass(frozen=True)
class OvSettings:
    """How an IR is compiled: device, precision, threads, streams, hint (stated in every report).

    ``dynamic_quantization`` is the CPU plugin's run-time int8 quantization of activations of matmuls with
    compressed weights, per this many input channels; 0 (the default here) keeps activations float, as the
    recipe computed them (OpenVINO's own default is 32 on CPUs that have it)."""

    device: str
    precision: InferencePrecision
    threads: int
    streams: int = 1
    hint: str = "LATENCY"
    dynamic_quantization: int = 0

    def config(self) -> dict[str, str]:
        """The properties passed to ``openvino.Core.compile_model``."""
        config = {"INFERENCE_PRECISION_HINT": self.precision, "PERFORMANCE_HINT": self.hint}
        if self.device.split(".")[0] == "CPU":
            config |= {"INFERENCE_NUM_THREADS": str(self.threads), "NUM_STREAMS": str(self.streams),
                       "ENABLE_CPU_PINNING": "NO", "DYNAMIC_QUANTIZATION_GROUP_SIZE": str(self.dynamic_quantization)}
        return config

    def describe(self) -> str:
        note = ov_device_note(self.device)
        quant = "off" if self.dynamic_quantization == 0 else f"group {self.dynamic_quantization}"
        return (f"openvino {self.device}{f' ({note})' if note else ''}, {self.precision} inference precision, "
                f"{self.threads} thread(s) (= torch's), {self.streams} stream, {self.hint} hint, dynamic shapes, "
                f"dynamic activation quantization {quant}")


def ir_file(path: Path) -> Path:
    """The ``.xml`` of an IR given as the file or as the export's directory holding one."""
    if path.is_dir():
        found = sorted(path.glob("*.xml"))
        if len(found) != 1:
            raise InfeasibleConfig(f"{path} holds {len(found)} OpenVINO IR .xml files, expected one")
        return found[0]
    return path


#: What the export records in the IR's ``rt_info`` under :data:`RT_INFO_SECTION`.
RECORDED_KEYS = ("inference_precision", "recipe", "versions")


def record_settings(model: openvino.Model, settings: Mapping[str, str]) -> None:
    """Write ``settings`` (keys of :data:`RECORDED_KEYS`) into the IR's ``rt_info``."""
    for key, value in settings.items():
        model.set_rt_info(value, [RT_INFO_SECTION, key])


def recorded_settings(model: openvino.Model) -> dict[str, str]:
    """What the export recorded in the IR's ``rt_info`` (:data:`RT_INFO_SECTION`): e.g. the precision."""
    return {key: str(model.get_rt_info([RT_INFO_SECTION, key]).astype(str)) for key in RECORDED_KEYS
            if model.has_rt_info([RT_INFO_SECTION, key])}


def ov_settings(device: torch.device, precision: InferencePrecision, threads: int | None = None) -> OvSettings:
    """The settings for torch ``device``: its first OpenVINO device, ``threads`` (default: torch's count)."""
    devices = capabilities(device).ov_devices
    if not devices:
        raise InfeasibleConfig(f"openvino has no device for {device.type} in this install "
                               "(the capability table lists none): use a torch runtime here")
    return OvSettings(devices[0], precision, threads if threads is not None else torch.get_num_threads())


def default_precision(device: torch.device) -> InferencePrecision:
    """The inference precision OpenVINO picks by itself on ``device``'s first OpenVINO device (what a plain
    ``compile_model`` gets, e.g. sentence-transformers' OpenVINO backend): ``bf16`` where its plugin chooses
    bf16, else ``f32`` (its f16 on ARM CPUs is no precision the export records)."""
    settings = ov_settings(device, "f32")
    chosen = shared_core().get_property(settings.device, "INFERENCE_PRECISION_HINT")
    name = chosen.to_string() if hasattr(chosen, "to_string") else str(chosen)
    return "bf16" if name in ("bf16", "bfloat16") else "f32"


def _message(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.startswith("Exception from")]
    text = f"{type(exc).__name__}: {lines[0] if lines else '(no message)'}"
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def require_precision(core: openvino.Core, settings: OvSettings) -> None:
    """A precision the device's plugin lacks (bf16 on a CPU without it) is an infeasible config."""
    needed = PRECISION_CAPABILITY[settings.precision]
    have = [str(c) for c in core.get_property(settings.device, "OPTIMIZATION_CAPABILITIES")]
    if needed not in have:
        raise InfeasibleConfig(f"openvino {settings.device} cannot infer in {settings.precision} "
                               f"(its capabilities: {', '.join(have)})")


def open_ir(path: Path, device: torch.device, threads: int | None = None,
            precision: InferencePrecision | None = None) -> OvModel:
    """The IR at ``path`` (``.xml``, or the export's directory) compiled with :func:`ov_settings` and the
    precision the export recorded (or ``precision``); a file OpenVINO cannot load or compile is an
    infeasible config with its message. The compile time is kept on the model (not latency)."""
    core = shared_core()
    xml = ir_file(path)
    start = time.perf_counter()
    try:
        model = core.read_model(str(xml))
    except Exception as exc:  # OpenVINO raises RuntimeError and its own types for unreadable files
        raise InfeasibleConfig(f"openvino cannot load {xml.name}: {_message(exc)}") from exc
    recorded = recorded_settings(model)
    chosen = precision or recorded.get("inference_precision", "f32")
    if chosen not in PRECISION_CAPABILITY:
        raise InfeasibleConfig(f"{xml.name} records inference precision '{chosen}': expected f32 or bf16")
    settings = ov_settings(device, chosen, threads)  # type: ignore[arg-type]  # checked just above
    require_precision(core, settings)
    try:
        compiled = core.compile_model(model, settings.device, settings.config())
    except Exception as exc:  # compile errors are RuntimeError with OpenVINO's text
        raise InfeasibleConfig(f"openvino cannot compile {xml.name} on {settings.device}: {_message(exc)}") from exc
    # The precision the compiled model reports it runs in (f32, bf16): what every report states.
    ran = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    return OvModel(compiled, replace(settings, precision=ran), device, time.perf_counter() - start)


class OvModel:
    """Calls a compiled OpenVINO model like a torch model: ``model(*tensors) -> first output``."""

    def __init__(self, compiled: openvino.CompiledModel, settings: OvSettings, device: torch.device,
                 creation_seconds: float = 0.0) -> None:
        self.compiled = compiled
        self.settings = settings
        self.device = device
        self.input_count = len(compiled.inputs)
        self.request = compiled.create_infer_request()
        #: Seconds OpenVINO took to read and compile the IR (paid once per model, not latency).
        self.creation_seconds = creation_seconds

    def outputs(self, inputs: Batch) -> list[Tensor]:
        """All outputs as float32 tensors on the model's device."""
        if len(inputs) != self.input_count:
            raise InfeasibleConfig(f"the OpenVINO model takes {self.input_count} inputs, the spec gives {len(inputs)}")
        return self._run(inputs)

    def __call__(self, *inputs: Tensor) -> Tensor:
        return self.outputs(inputs)[0]

    def describe(self) -> str:
        """Device, precision, threads, streams and hint, as reports state them."""
        return self.settings.describe()

    def _run(self, inputs: Sequence[Tensor]) -> list[Tensor]:
        feed = [t.detach().cpu().numpy() for t in inputs]
        try:
            results: Mapping[object, np.ndarray] = self.request.infer(feed)
        except Exception as exc:  # OpenVINO raises RuntimeError with its own text
            raise InfeasibleConfig(f"openvino inference failed: {_message(exc)}") from exc
        # The arrays share memory with the request's output tensors: copy before the next call overwrites them.
        return [torch.from_numpy(np.array(result, dtype=np.float32, copy=True)).to(self.device)
                for result in results.values()]
