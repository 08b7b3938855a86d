"""Model sources beyond Python specs: TorchScript files, ``.pt2`` programs, local Hugging Face directories.

``MODEL=`` forms handled here (see :func:`resolve_source`):

* ``path/model.pt`` (``.pth``, ``.ts``, ``.jit``, ``.torchscript``): a TorchScript file;
* ``path/model.pt2``: a ``torch.export`` ExportedProgram;
* ``hf:path/to/dir``: a local Hugging Face directory.

None of them carries data, so each becomes a *fidelity* spec (see
:mod:`paretorch.pipeline.core.fidelity`): the targets are the unoptimized model's own outputs
on generated inputs (``--input-shape``), on the samples of ``--inputs-file``
(a ``.pt`` file for TorchScript / ``.pt2``, a text file for ``hf:``).
"""

from __future__ import annotations

import torch
from torch import nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.fidelity import OUTPUT_KINDS
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.task_data import ClassificationData, load_task_data, task_texts
from paretorch.pipeline.core.user_files import SourceOptions, hf_input_shape, source_kind, text_data_for_tensors
from paretorch.pipeline.sources.exported import exported_spec
from paretorch.pipeline.sources.huggingface import hf_spec
from paretorch.pipeline.sources.torchscript import torchscript_spec


def resolve_source(ref: str, options: SourceOptions = SourceOptions()) -> ModelSpec | None:
    """The spec for a TorchScript / ``.pt2`` / ``hf:`` reference, or None if ``ref`` is none of these."""
    kind = source_kind(ref)
    if kind is None:
        return None
    if options.output_kind not in OUTPUT_KINDS:
        raise SpecError(f"unknown --output-kind '{options.output_kind}': choose one of {', '.join(OUTPUT_KINDS)}")
    data = load_task_data(options.eval_data) if options.eval_data else None
    if kind == "hf":
        if options.input_shape:
            raise hf_input_shape()
        spec = hf_spec(ref, options.inputs_file, options.output_kind, task_texts(data) if data else None)
    else:
        samples = data.tensors if isinstance(data, ClassificationData) else None
        if data is not None and samples is None:
            raise text_data_for_tensors(data.source, kind)
        if kind == "pt2":
            spec = exported_spec(ref, options.input_shape, options.inputs_file, options.output_kind,
                                 options.trust_pickle, samples)
        else:
            spec = torchscript_spec(ref, options.input_shape, options.inputs_file, options.output_kind, samples)
    object.__setattr__(spec, "source", ref)
    return spec


def layer_access_problem(model: nn.Module) -> str | None:
    """Why stages that rewrite layer modules (structured pruning, torchao quantization,
    ``torch.nn.utils.prune``) cannot act on ``model``, or None if they can.

    TorchScript modules hold compiled code; a ``.pt2`` program's module holds
    graph operations on parameters, with no ``nn.Linear`` / ``nn.Conv*`` modules.
    Those stages silently do nothing on them (torchao, torch-pruning) or crash
    (``torch.nn.utils.prune`` on TorchScript), so they should raise
    ``InfeasibleConfig`` with this reason.
    """
    if isinstance(model, torch.jit.ScriptModule) or any(
        isinstance(m, torch.jit.ScriptModule) for m in model.modules()
    ):
        return "the model is TorchScript (compiled code, no Python layers to rewrite)"
    layer_types = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    if isinstance(model, torch.fx.GraphModule) and not any(isinstance(m, layer_types) for m in model.modules()):
        return "the model is a torch.export program (its layers are graph ops, not nn.Linear/nn.Conv modules)"
    return None


__all__ = ["SourceOptions", "layer_access_problem", "resolve_source", "source_kind"]
