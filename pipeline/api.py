"""Scripted reuse of stages: one stage, or a chain of them, from Python.

::

    from paretorch.experiments.models.digits import spec
    from paretorch.pipeline.api import StageContext, apply_stage, load_model, run_chain
    from paretorch.stages.prune.stage import PruneConfig
    from paretorch.stages.quantize.stage import QuantizeConfig
    from paretorch.stages.export.onnx import ONNXExportConfig

    model = load_model(spec)
    pruned = apply_stage(model, PruneConfig(ratio=0.3), StageContext(spec, "cpu"))
    result = run_chain(model, [PruneConfig(ratio=0.3), QuantizeConfig(method="int8_dynamic"), ONNXExportConfig()],
                       StageContext(spec, "cpu", output_dir="exports/int8"))
    result.model, result.exports, result.recipe.save("recipe.json")   # exports/int8/digits.onnx

:func:`run_chain` is the search's :class:`~paretorch.pipeline.engine.runner.Runner` over the
chain's pipeline (:func:`~paretorch.pipeline.engine.graph.recipe_pipeline`): model stages in
order, exports after the last one, the same cache keys (so AMP calibrations are
reused within the process) and the same resolved recipe as a search trial.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.paths import cache_dir, results_dir
from paretorch.pipeline.core.runtimes.registry import prepare_runtime
from paretorch.pipeline.core.spec import ModelSpec, load_model
from paretorch.pipeline.core.stage import ExportResult, StageConfig, StageContext, apply_stage, is_export
from paretorch.pipeline.core.text_batches import TextBatches
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.deliver import deliver
from paretorch.pipeline.engine.deployment import (
    deploy_stage,
    load_weights,
    open_file,
    read_deployment,
    rebuild_configs,
    runtime_encoder,
)
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.runner import Runner

#: The encoder :func:`with_tokenizer` hands back as it was given.
E = TypeVar("E")

__all__ = ["ChainResult", "StageContext", "apply_stage", "load_deployment", "load_model", "run_chain"]


@dataclass
class ChainResult:
    """What a chain produced: the final model, the export results and the replayable recipe.

    Unpacks as ``model, exports, resolved_configs`` as well.
    """

    model: nn.Module
    exports: list[ExportResult]
    recipe: Recipe
    records: dict[str, object] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.exports, list(self.recipe.stages)))


def run_chain(
    model: nn.Module,
    configs: Sequence[StageConfig],
    ctx: StageContext,
    runtime: str = DEFAULT_RUNTIME,
    cache: NodeCache | None = None,
) -> ChainResult:
    """Apply ``configs`` to ``model`` (not modified): model stages in order, then exports.

    Exports are written to ``ctx.output_dir`` itself (required when ``configs`` has exports): e.g.
    ``<output_dir>/<spec>.onnx``, each result's ``path`` there. They are made through the export cache
    (``<results>/cache/exports``, or ``cache``'s), so an unchanged chain reuses its files.
    Every node's records are added to ``ctx.records``.
    """
    exports = [c for c in configs if is_export(c)]
    if exports and ctx.output_dir is None:
        raise ConfigError("this chain has export stages, which write files: give StageContext an output_dir")
    if cache is None:
        cache = NodeCache(export_dir=cache_dir("exports") if exports else None)
    pipeline = recipe_pipeline(configs, name="chain")
    runner = Runner(pipeline, ctx.spec, ctx.device, cache=cache, latency=ctx.latency,
                    batch_sizes=ctx.latency_batch_sizes, work_dir=results_dir() / "work", model=model)
    result = runner.run(runtime=runtime, evaluate=False)
    for node in result.nodes.values():
        ctx.records.update(node.records)
    return ChainResult(
        model=result.model,
        exports=[deliver(export, output) for export in result.exports.values() if (output := ctx.output_dir)],
        recipe=result.recipe(ctx.spec.name),
        records=dict(ctx.records),
    )


def load_deployment(directory: str | Path, spec: ModelSpec, device: str | torch.device = "cpu",
                    runtime: str | None = None) -> Callable[..., Any]:
    """The callable a deployment runs, from the ``deploy/`` folder ``pipeline apply`` (or a search, in each Pareto
    trial's folder) wrote: for a recipe whose stage builds one, that (pack: a
    :class:`paretorch.stages.pack.deploy.PackedEncoder`, token id lists in, embeddings out; under ``onnxruntime`` /
    ``openvino`` a
    :class:`paretorch.pipeline.core.length_groups.GroupedEncoder` over the file); for any other recipe the model
    prepared for its runtime (or the file the runtime ran), called on host batches
    (:class:`paretorch.pipeline.core.text_batches.ModelEncoder`: ``encoder(*host_inputs)``, host float32 outputs).

    ``spec``: the model's spec (its ``build`` makes the unoptimized structure); ``runtime``: the recipe's when
    None. The recipe's stages are replayed for structure only (no fine-tuning, no distillation, no export), the
    saved weights loaded strictly over the result (:mod:`paretorch.pipeline.engine.deployment`: no file in the folder
    runs code on load), then the stage's ``deploy`` builds the callable. A folder of a recipe whose runtime runs
    a file (``onnxruntime``, ``openvino``) holds that file instead: it is opened in the recipe's runtime and called
    per length group (a :class:`paretorch.pipeline.core.length_groups.GroupedEncoder`, the same token-list contract).
    Either takes strings too: ``encoder.encode(texts, batch_size=32)`` tokenizes with the spec's ``encode_text``, sorts
    a corpus by length, tokenizes a batch ahead while the model runs, and returns the rows in input order."""
    deployment = read_deployment(directory)
    recipe = deployment.recipe
    stage = deploy_stage(recipe.stages)
    if recipe.model and recipe.model != spec.name:
        raise ConfigError(f"{directory} holds a model of '{recipe.model}', not of '{spec.name}': give its spec")
    device = torch.device(device)
    if deployment.weights is None:
        if runtime not in (None, recipe.runtime):
            raise ConfigError(f"{directory} holds the file runtime {recipe.runtime} ran: load it without runtime= "
                              f"(or with runtime={recipe.runtime!r})")
        return with_tokenizer(open_file(deployment, spec, device), spec)
    weights = deployment.weights
    model = run_chain(load_model(spec), rebuild_configs(recipe.stages), StageContext(spec, device)).model
    load_weights(model, weights, device)
    runtime = runtime or recipe.runtime
    if stage is None or stage.deploy is None:  # the model prepared for its runtime, on host batches
        return with_tokenizer(runtime_encoder(prepare_runtime(model.eval(), runtime, device), runtime, spec, device),
                              spec)
    return with_tokenizer(stage.deploy(model.eval(), device, runtime), spec)


def with_tokenizer(encoder: E, spec: ModelSpec) -> E:
    """``encoder`` with the spec's text encoder set, so that ``encoder.encode(texts)`` takes strings
    (:class:`paretorch.pipeline.core.text_batches.TextBatches`; an encoder of another kind is returned as it is)."""
    if isinstance(encoder, TextBatches) and spec.encode_text is not None:
        encoder.encode_text = spec.encode_text
    return encoder
