"""TorchScript files (``torch.jit.save``): ``MODEL=model.pt`` / ``.pth`` / ``.ts`` / ``.jit`` / ``.torchscript``.

The loaded module is a :class:`torch.jit.ScriptModule`: it runs, can be timed,
cast and autocast, but its layers are compiled code, so stages that rewrite
Python modules (structured pruning, torchao quantization, ``torch.compile``)
cannot act on it; they report it as infeasible.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.spec import Batch, ModelSpec
from paretorch.pipeline.sources.archive import SAVE_HINT, archive_kind, file_model_spec, one_line
from paretorch.pipeline.sources.inputs import TensorInputs


def load_torchscript(path: Path) -> nn.Module:
    """``torch.jit.load`` on the CPU, with one-line errors for files that are not TorchScript."""
    kind = archive_kind(path)
    if kind == "pt2":
        raise SpecError(f"{path} is a torch.export (.pt2) archive, not TorchScript: rename it to .pt2")
    if kind == "torch_save":
        raise SpecError(
            f"{path} holds a torch.save'd object (a state_dict or pickled module), "
            f"not a TorchScript program: {SAVE_HINT}"
        )
    try:
        return torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:  # corrupt or incompatible archive: one line, with the cause
        raise SpecError(f"cannot load TorchScript file {path}: {one_line(exc)}") from exc


def torchscript_spec(
    path_text: str, input_shape: str | None = None, inputs_file: str | None = None, output_kind: str = "auto",
    eval_samples: Batch | None = None,
) -> ModelSpec:
    """A fidelity spec for a TorchScript file (inputs from ``--input-shape`` or ``--inputs-file``)."""
    path = Path(path_text).expanduser()
    model = load_torchscript(path)  # bad files fail before the inputs are even looked at
    inputs = TensorInputs.from_options(input_shape, inputs_file, f"TorchScript file {path}", eval_samples)
    return file_model_spec(path, "TorchScript", load_torchscript, model, inputs, output_kind)
