"""The files a deployment loads a recipe's model from, and reading them back; none of them runs code on load.

``pipeline apply --recipe R --output X`` writes them to ``X/deploy/``, and a search to each Pareto trial's folder, for
every recipe: one holding a stage with a ``deploy`` callable (:attr:`paretorch.pipeline.core.stage.Stage.deploy`; pack's
token-id-list encoder) deploys that; any other the model prepared for its runtime
(:class:`paretorch.pipeline.core.text_batches.ModelEncoder`: host batches, or strings through ``encode``):

* under a runtime that runs the torch model: ``weights.safetensors``, the final model's state dict (safetensors
  holds tensors only, no code); or ``weights.pt`` when the model holds tensor subclasses safetensors cannot store
  (torchao's int8 weights), a ``torch.save`` state dict read back with ``torch.load(weights_only=True)``, which
  unpickles tensors and the allow-listed tensor classes only and refuses anything else;
* under a runtime that runs a file (``onnxruntime``, ``openvino``): that file (``.onnx``; an IR's ``.xml`` +
  ``.bin``), the one the trial ran, which the runtime calls once per length group of rows
  (:mod:`paretorch.pipeline.core.length_groups`); ONNX and OpenVINO IR files hold graphs and tensors, no code;
* ``recipe.json``: the resolved recipe (stage configs, runtime), plain JSON;
* ``deployment.json``: what the folder holds and how to load it.

:func:`paretorch.pipeline.api.load_deployment` rebuilds the callable: for weights, the spec's model (the user's own
code, as every command runs it), the recipe's stages replayed for structure only (:meth:`StageConfig.structure_only`: no
fine-tuning, no distillation), the saved weights loaded strictly over it, then the stage's ``deploy``; for a file,
the file opened in its runtime (:func:`open_file`) behind the same token-list contract
(:class:`paretorch.pipeline.core.length_groups.GroupedEncoder`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.length_groups import GroupedEncoder, LengthGrouped
from paretorch.pipeline.core.runtimes.base import GivenExport
from paretorch.pipeline.core.runtimes.registry import get_runtime, prepare_runtime
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import ExportResult, Stage, StageConfig, is_export, stage_for
from paretorch.pipeline.core.text_batches import ModelEncoder
from paretorch.pipeline.engine.deliver import companions, deliver
from paretorch.pipeline.engine.recipe import Recipe

#: The manifest's callable of a recipe without a deploying stage: the model prepared for its runtime.
MODEL_CALLABLE = "model"
#: The folder under ``apply``'s output.
DEPLOY_DIR = "deploy"
SAFE_WEIGHTS = "weights.safetensors"
PICKLED_WEIGHTS = "weights.pt"
RECIPE = "recipe.json"
MANIFEST = "deployment.json"
FORMAT = "paretorch-deployment/1"


@dataclass(frozen=True)
class Deployment:
    """A folder :func:`save_deployment` wrote: its recipe and either the weights or the runtime's file (with the
    padding-mask input its calls group by and the longest token list the model takes)."""

    recipe: Recipe
    weights: Path | None = None
    file: Path | None = None
    file_format: str = ""
    grouped_mask_input: int | None = None
    max_length: int | None = None


def deploy_stage(configs: Sequence[StageConfig]) -> Stage[StageConfig] | None:
    """The last stage of ``configs`` whose record builds a deployment's callable (None: no such stage)."""
    stages = [stage_for(config) for config in configs if not is_export(config)]
    return next((stage for stage in reversed(stages) if stage.deploy is not None), None)


def rebuild_configs(configs: Sequence[StageConfig]) -> list[StageConfig]:
    """The model stages of ``configs`` that rebuild the structure saved weights load into."""
    return [rebuilt for config in configs if not is_export(config)
            if (rebuilt := config.structure_only()) is not None]


def save_deployment(model: nn.Module, recipe: Recipe, directory: Path,
                    runtime_file: ExportResult | None = None) -> dict[str, object]:
    """Write ``model``'s weights (or, under a runtime that runs a file, ``runtime_file``: the file the trial ran),
    ``recipe`` and the manifest to ``directory``; returns the manifest."""
    stage = deploy_stage(recipe.stages)
    directory.mkdir(parents=True, exist_ok=True)
    _remove_previous(directory)
    manifest: dict[str, object] = {"format": FORMAT, "model": recipe.model,
                                "callable": stage.name if stage is not None else MODEL_CALLABLE,
                                "runtime": recipe.runtime, "recipe": RECIPE,
                                "load": "paretorch.pipeline.api.load_deployment(<this folder>, <the model's spec>, "
                                        "device, "
                                        "runtime=None)"}
    if get_runtime(recipe.runtime).export is None:
        manifest["weights"] = _save_weights(model, directory)
    else:
        if runtime_file is None:
            raise ConfigError(f"runtime {recipe.runtime} deploys the file it ran: give it (Runner.runtime_file)")
        if stage is not None and runtime_file.grouped_mask_input is None:
            raise ConfigError(f"{recipe.model or 'this model'} has no padding mask for {recipe.runtime} to group rows "
                              "by, so the pack stage changes nothing here: drop pack from the recipe")
        shipped = deliver(runtime_file, directory)
        manifest |= {"file": Path(shipped.path).name, "format_of_file": shipped.format,
                     "grouped_mask_input": shipped.grouped_mask_input,
                     "max_length": getattr(model, "max_length", None)}
    recipe.save(directory / RECIPE)
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def _remove_previous(directory: Path) -> None:
    """The model files an earlier deployment wrote to ``directory`` (its manifest's weights or file), removed: a folder
    holds one deployment."""
    for stale in (SAFE_WEIGHTS, PICKLED_WEIGHTS):
        (directory / stale).unlink(missing_ok=True)
    if not (directory / MANIFEST).is_file():
        return
    named = json.loads((directory / MANIFEST).read_text()).get("file")
    if isinstance(named, str) and named:
        old = directory / Path(named).name
        for path in companions(old):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


def _save_weights(model: nn.Module, directory: Path) -> str:
    """``model``'s state dict in ``directory``: safetensors where it holds plain tensors only; the file's name."""
    state = {name: tensor.detach().to("cpu").clone() for name, tensor in model.state_dict().items()}
    plain = all(type(tensor) in (Tensor, nn.Parameter) for tensor in state.values())
    weights = SAFE_WEIGHTS if plain else PICKLED_WEIGHTS
    if plain:
        save_file({name: tensor.contiguous() for name, tensor in state.items()}, directory / weights)
    else:
        torch.save(state, directory / weights)
    return weights


def read_deployment(directory: str | Path) -> Deployment:
    """What a folder :func:`save_deployment` wrote holds (its files checked to be there)."""
    directory = Path(directory)
    if not (directory / MANIFEST).is_file():
        raise ConfigError(f"{directory} holds no {MANIFEST}: give the deploy/ folder `pipeline apply` wrote")
    manifest = json.loads((directory / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ConfigError(f"{directory / MANIFEST} is not a {FORMAT} manifest: write it again with `pipeline apply`")
    recipe = Recipe.load(directory / str(manifest["recipe"]))
    if manifest.get("file") is not None:
        file = directory / Path(str(manifest["file"])).name
        grouped = manifest.get("grouped_mask_input")
        if not file.exists() or not (isinstance(grouped, int) or manifest.get("callable") == MODEL_CALLABLE):
            raise ConfigError(f"{file} is missing or the manifest lacks its padding mask: write the folder again "
                              "with `pipeline apply`")
        max_length = manifest.get("max_length")
        return Deployment(recipe, file=file, file_format=str(manifest.get("format_of_file", "")),
                          grouped_mask_input=grouped if isinstance(grouped, int) else None,
                          max_length=max_length if isinstance(max_length, int) else None)
    weights = directory / str(manifest.get("weights"))
    if weights.name not in (SAFE_WEIGHTS, PICKLED_WEIGHTS) or not weights.is_file():
        raise ConfigError(f"{weights} is missing: write the folder again with `pipeline apply`")
    return Deployment(recipe, weights=weights)


def open_file(deployment: Deployment, spec: ModelSpec, device: torch.device) -> GroupedEncoder | ModelEncoder:
    """A file deployment opened in its recipe's runtime: a pack recipe's called per length group behind the
    token-list contract (the longest token list: the manifest's, else the width of ``spec``'s inputs), any other
    recipe's called on host batches (:class:`paretorch.pipeline.core.text_batches.ModelEncoder`)."""
    if deployment.file is None:
        raise ConfigError("this deployment holds weights, not a file: load it with "
                          "paretorch.pipeline.api.load_deployment")
    runtime = deployment.recipe.runtime
    result = ExportResult(format=deployment.file_format, path=deployment.file, size_bytes=0,
                          validation="a deployment's file", grouped_mask_input=deployment.grouped_mask_input)
    if deployment.grouped_mask_input is None:  # a recipe without pack: the file on the batch as it comes
        return runtime_encoder(prepare_runtime(nn.Identity(), runtime, device, GivenExport(result)), runtime, spec,
                               device)
    grouped = prepare_runtime(nn.Identity(), runtime, device, GivenExport(result))
    if not isinstance(grouped, LengthGrouped):
        raise ConfigError(f"runtime {runtime} does not call its file per length group: load the folder with a "
                          "runtime that does (onnxruntime, openvino)")
    max_length = deployment.max_length or int(spec.example_inputs(1)[deployment.grouped_mask_input].shape[1])
    return GroupedEncoder(grouped, max_length)


def runtime_encoder(fn: Callable[..., Tensor], runtime: str, spec: ModelSpec, device: torch.device) -> ModelEncoder:
    """``fn`` (prepared for ``runtime``) behind host batches: cut to their longest sample, or padded to their length
    bucket where ``runtime`` compiles static shapes."""
    return ModelEncoder(fn, device, spec.padding_mask, get_runtime(runtime).static_shapes)


def load_weights(model: nn.Module, weights: Path, device: torch.device) -> None:
    """Load the saved state dict into ``model`` (the rebuilt structure), strictly: every name and shape must
    match, else one error saying the rebuild differs from the saved model."""
    if weights.name == SAFE_WEIGHTS:
        state: dict[str, Tensor] = load_file(weights, device=str(device))
    else:
        state = torch.load(weights, map_location=device, weights_only=True)
    subclasses = any(type(tensor) not in (Tensor, nn.Parameter) for tensor in state.values())
    try:
        model.load_state_dict(state, strict=True, assign=subclasses)
    except RuntimeError as exc:
        raise ConfigError(f"the rebuilt model does not match the saved weights in {weights} (was the spec's model "
                          f"or the recipe changed since `pipeline apply` wrote them?): {str(exc)[:400]}") from exc
