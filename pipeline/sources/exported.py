"""``torch.export`` archives: ``MODEL=model.pt2`` (``torch.export.save``).

The model is ``torch.export.load(path).module()``: an ``fx.GraphModule`` whose
layers are graph operations (``aten.linear``, ``aten.conv2d``) on parameters,
not ``nn.Linear`` / ``nn.Conv2d`` modules. It runs eagerly and under
``torch.compile``; stages that look for layer modules (structured pruning,
torchao quantization) find none and report it as infeasible. The program must
have been exported with a dynamic batch dimension, and it runs as exported:
``eval()`` / ``train()`` only set flags (export already fixed dropout and
batch-norm behaviour, so export the model in eval mode).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from torch import nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.spec import Batch, ModelSpec
from paretorch.pipeline.sources.archive import SAVE_HINT, archive_kind, file_model_spec, one_line
from paretorch.pipeline.sources.inputs import TensorInputs
from paretorch.pipeline.sources.pt2_safety import code_entries, untrusted_message


def load_exported(path: Path, trust_pickle: bool = False) -> nn.Module:
    """``torch.export.load(path).module()``, with one-line errors for files that are not .pt2 archives.

    An archive whose entries would be unpickled (which can run code) is refused unless ``trust_pickle``."""
    import torch.export

    kind = archive_kind(path)
    if kind == "torchscript":
        raise SpecError(f"{path} is a TorchScript archive, not a torch.export program: rename it to .pt (TorchScript)")
    if kind == "torch_save":
        raise SpecError(f"{path} holds a torch.save'd object, not a torch.export program: {SAVE_HINT}")
    if kind == "pt2" and not trust_pickle:
        entries = code_entries(path)
        if entries:
            raise SpecError(untrusted_message(path, entries))
    try:
        module = torch.export.load(str(path)).module()
    except Exception as exc:  # corrupt or incompatible archive: one line, with the cause
        raise SpecError(f"cannot load .pt2 file {path}: {one_line(exc)}") from exc
    # ExportedProgram.module() replaces train()/eval() with methods that raise; the graph is
    # already specialized to the mode it was exported in, so the plain flag-setting methods are right.
    for name in ("train", "eval"):
        module.__dict__.pop(name, None)
    return module


def exported_spec(
    path_text: str, input_shape: str | None = None, inputs_file: str | None = None, output_kind: str = "auto",
    trust_pickle: bool = False, eval_samples: Batch | None = None,
) -> ModelSpec:
    """A fidelity spec for a ``.pt2`` ExportedProgram (inputs from ``--input-shape`` or ``--inputs-file``)."""
    path = Path(path_text).expanduser()
    load = partial(load_exported, trust_pickle=trust_pickle)
    model = load(path)  # bad files fail before the inputs are even looked at
    inputs = TensorInputs.from_options(input_shape, inputs_file, f".pt2 file {path}", eval_samples)
    return file_model_spec(path, ".pt2", load, model, inputs, output_kind)
