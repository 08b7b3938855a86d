"""Models that arrive as one file (TorchScript, ``.pt2``): sniffing the file, checking it, wrapping it as a spec."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.fidelity import fidelity_spec
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.user_files import require_model_file
from paretorch.pipeline.sources.inputs import TensorInputs

ArchiveKind = Literal["torchscript", "pt2", "torch_save"]

SAVE_HINT = (
    "save the model with torch.jit.save(torch.jit.script(model), 'model.pt') or "
    "torch.export.save(torch.export.export(model, inputs), 'model.pt2'), or write a Python spec (path/file.py:attr)"
)


def one_line(exc: BaseException, limit: int = 240) -> str:
    """The most telling line of an exception's message (TorchScript errors span many lines)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    telling = next((line for line in lines if "Error" in line or "error" in line), lines[0])
    prefix = f"{type(exc).__name__}: "
    return prefix + telling.removeprefix(prefix)[:limit]


def archive_kind(path: Path) -> ArchiveKind:
    """What kind of torch archive ``path`` is, from the names inside the zip (never unpickles)."""
    require_model_file(path)
    if not zipfile.is_zipfile(path):
        raise SpecError(f"{path} is not a torch archive (not a zip file): {SAVE_HINT}")
    with zipfile.ZipFile(path) as archive:
        names = {name.split("/", 1)[1] for name in archive.namelist() if "/" in name}
    if "archive_format" in names:
        return "pt2"
    if "constants.pkl" in names and any(name.startswith("code/") for name in names):
        return "torchscript"
    if "data.pkl" in names:
        return "torch_save"
    raise SpecError(f"{path} is a zip file but not a TorchScript or .pt2 archive: {SAVE_HINT}")


def check_batch_flexible(model: nn.Module, inputs: TensorInputs, name: str) -> Tensor:
    """Run the model at batch sizes 2 and 3 (the pipeline uses several), then batch 2 again (a model that
    answers one input twice differently keeps state or is random); return the batch-2 output."""
    check_tensor_arguments(model, name)
    outputs = {}
    for batch_size in (2, 3):
        batch = inputs.example_inputs(batch_size)
        try:
            with torch.inference_mode():
                output = model(*batch)
        except Exception as exc:  # the user's model: quote its error on one line
            shapes = ", ".join("x".join(str(d) for d in t.shape) for t in batch)
            raise SpecError(
                f"{name}: forward on a batch of shape {shapes} failed ({one_line(exc)}); check --input-shape / "
                "--inputs-file, and that the model accepts any batch size (a .pt2 needs a dynamic batch dimension: "
                "torch.export.export(..., dynamic_shapes=...) with torch.export.Dim('batch'))"
            ) from exc
        if not isinstance(output, Tensor) or not output.is_floating_point():
            raise SpecError(f"{name}: forward returned {type(output).__name__}; it must return one floating tensor")
        if output.dim() == 0 or output.shape[0] != batch_size:
            raise SpecError(
                f"{name}: forward on a batch of {batch_size} returned shape {tuple(output.shape)}; "
                "the first output dimension must be the batch"
            )
        outputs[batch_size] = output
    with torch.inference_mode():
        again = model(*inputs.example_inputs(2))
    if not isinstance(again, Tensor) or again.shape != outputs[2].shape or not torch.allclose(
            again, outputs[2], rtol=1e-4, atol=1e-5):
        raise SpecError(f"{name}: forward gave different outputs for the same input on a second call: the model "
                        "keeps state between calls (a counter, a cache, a running buffer) or is random (dropout "
                        "left on); fidelity needs a stateless model: save it in eval mode without the state")
    return outputs[2]


def check_tensor_arguments(model: nn.Module, name: str) -> None:
    """Refuse a TorchScript forward that takes anything but tensors (the pipeline feeds tensor batches only)."""
    if not isinstance(model, torch.jit.ScriptModule):
        return
    arguments = model.forward.schema.arguments[1:]  # type: ignore[attr-defined]  # [0] is self
    others = [f"{a.name}: {a.type}" for a in arguments if str(a.type) not in ("Tensor", "Tensor?")]
    if others:
        raise SpecError(f"{name}: forward takes {', '.join(others)}; only tensor arguments are supported. Wrap it: "
                        "a module whose forward(x) calls the model with the other arguments fixed "
                        "(e.g. return self.model(x, 16000)), then torch.jit.script and save that module")


def file_model_spec(
    path: Path,
    kind: str,
    load: Callable[[Path], nn.Module],
    loaded: nn.Module,
    inputs: TensorInputs,
    output_kind: str,
) -> ModelSpec:
    """A fidelity spec around a model file (``loaded``: the model ``load(path)`` returned once, for checks):
    generated or file inputs, targets from the model's own outputs (run once, ``ModelSpec.unoptimized``)."""
    name = path.stem

    def build() -> nn.Module:
        return load(path).eval()

    check_batch_flexible(loaded.eval(), inputs, f"{kind} file {path}")
    return fidelity_spec(
        name=name,
        build=build,
        example_inputs=inputs.example_inputs,
        calibration=inputs.calibration,
        evaluation_inputs=inputs.evaluation,
        output_kind=output_kind,
        description=f"{kind} model from {path} (fidelity to its own outputs on generated/file inputs)",
    )
