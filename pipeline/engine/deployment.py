"""The files a deployment loads a recipe's model from, and reading them back; none of them runs code on load.

``pipeline apply --recipe R --output X`` writes them to ``X/deploy/`` for a recipe holding a stage with a
``deploy`` callable (:attr:`pipeline.core.stage.Stage.deploy`; pack's token-id-list encoder):

* ``weights.safetensors``: the final model's state dict (safetensors holds tensors only, no code); or
  ``weights.pt`` when the model holds tensor subclasses safetensors cannot store (torchao's int8 weights),
  a ``torch.save`` state dict read back with ``torch.load(weights_only=True)``, which unpickles tensors and
  the allow-listed tensor classes only and refuses anything else;
* ``recipe.json``: the resolved recipe (stage configs, runtime), plain JSON;
* ``deployment.json``: what the folder holds and how to load it.

:func:`pipeline.api.load_deployment` rebuilds the callable: the spec's model (the user's own code, as every
command runs it), the recipe's stages replayed for structure only (:meth:`StageConfig.structure_only`: no
fine-tuning, no distillation), the saved weights loaded strictly over it, then the stage's ``deploy``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from pipeline.core.errors import ConfigError
from pipeline.core.stage import Stage, StageConfig, is_export, stage_for
from pipeline.engine.recipe import Recipe

#: The folder under ``apply``'s output.
DEPLOY_DIR = "deploy"
SAFE_WEIGHTS = "weights.safetensors"
PICKLED_WEIGHTS = "weights.pt"
RECIPE = "recipe.json"
MANIFEST = "deployment.json"
FORMAT = "paretorch-deployment/1"


def deploy_stage(configs: Sequence[StageConfig]) -> Stage[StageConfig] | None:
    """The last stage of ``configs`` whose record builds a deployment's callable (None: no such stage)."""
    stages = [stage_for(config) for config in configs if not is_export(config)]
    return next((stage for stage in reversed(stages) if stage.deploy is not None), None)


def rebuild_configs(configs: Sequence[StageConfig]) -> list[StageConfig]:
    """The model stages of ``configs`` that rebuild the structure saved weights load into."""
    return [rebuilt for config in configs if not is_export(config)
            if (rebuilt := config.structure_only()) is not None]


def save_deployment(model: nn.Module, recipe: Recipe, directory: Path) -> dict[str, Any]:
    """Write ``model``'s weights, ``recipe`` and the manifest to ``directory``; returns the manifest."""
    stage = deploy_stage(recipe.stages)
    if stage is None:
        raise ConfigError(f"recipe '{recipe.describe()}' has no stage that builds a deployable callable")
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().to("cpu").clone() for name, tensor in model.state_dict().items()}
    plain = all(type(tensor) in (Tensor, nn.Parameter) for tensor in state.values())
    weights = SAFE_WEIGHTS if plain else PICKLED_WEIGHTS
    for stale in {SAFE_WEIGHTS, PICKLED_WEIGHTS} - {weights}:
        (directory / stale).unlink(missing_ok=True)
    if plain:
        save_file({name: tensor.contiguous() for name, tensor in state.items()}, directory / weights)
    else:
        torch.save(state, directory / weights)
    recipe.save(directory / RECIPE)
    manifest = {"format": FORMAT, "model": recipe.model, "callable": stage.name, "runtime": recipe.runtime,
                "weights": weights, "recipe": RECIPE,
                "load": "pipeline.api.load_deployment(<this folder>, <the model's spec>, device, runtime=None)"}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def read_deployment(directory: str | Path) -> tuple[Recipe, Path]:
    """The recipe and the weights file of a folder :func:`save_deployment` wrote."""
    directory = Path(directory)
    if not (directory / MANIFEST).is_file():
        raise ConfigError(f"{directory} holds no {MANIFEST}: give the deploy/ folder `pipeline apply` wrote")
    manifest = json.loads((directory / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ConfigError(f"{directory / MANIFEST} is not a {FORMAT} manifest: write it again with `pipeline apply`")
    weights = directory / str(manifest["weights"])
    if weights.name not in (SAFE_WEIGHTS, PICKLED_WEIGHTS) or not weights.is_file():
        raise ConfigError(f"{weights} is missing: write the folder again with `pipeline apply`")
    return Recipe.load(directory / str(manifest["recipe"])), weights


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
