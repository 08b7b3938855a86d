"""What a command names, checked before torch is imported: the model and its files, the recipes, the search config
with the flags that override it, the pipeline file and the stores.

:func:`check_inputs` runs after :func:`paretorch.pipeline.cli.parser.check_args` (each option on its own) and the
results folder, and before :mod:`paretorch.pipeline.cli.commands` (torch, Optuna, MLflow) is imported, so a missing
file, an invalid config or options that do not fit together cost a fraction of a second of CPU, not the seconds
torch's import takes. Every problem is a :class:`~paretorch.pipeline.core.errors.PipelineError`: one ``error:``
line, exit code 2. What only the files' contents tell (an archive that does not load, a Python spec whose import
fails, a pipeline's or a recipe's stage configs, a data table's rows) the commands find.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from paretorch.pipeline.cli.parser import split_list
from paretorch.pipeline.cli.store_urls import validate_storage_url, validate_tracking_uri
from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.paths import pipeline_file
from paretorch.pipeline.core.user_files import SourceOptions, check_model_reference
from paretorch.pipeline.core.yaml_file import read_yaml
from paretorch.pipeline.search.schema import SearchSchema

#: The commands that open a study (and take the search options).
SEARCH_COMMANDS = ("optimize", "report")


def check_inputs(args: argparse.Namespace) -> None:
    """Every check of the command's files, configs and option combinations that needs no torch."""
    check_model_reference(args.model, source_options(args))
    if (recipe := getattr(args, "recipe", None)) is not None:
        require_recipe(recipe, "--recipe")
    for path in getattr(args, "enqueue", None) or ():
        require_recipe(path, "--enqueue")
    if args.command in SEARCH_COMMANDS:
        settings = SearchSchema.load(args.search_config, **search_overrides(args))
        if settings.pipeline != "default":
            read_yaml(pipeline_file(settings.pipeline), "--pipeline")  # its stages are checked once they load
        if args.storage:
            validate_storage_url(args.storage)
        if args.command == "optimize" and not args.no_tracking and args.tracking_uri:
            validate_tracking_uri(args.tracking_uri)


def source_options(args: argparse.Namespace) -> SourceOptions:
    """The options that go with ``--model`` (``--input-shape``, ``--inputs-file``, ...)."""
    return SourceOptions(
        input_shape=getattr(args, "input_shape", None),
        inputs_file=getattr(args, "inputs_file", None),
        output_kind=getattr(args, "output_kind", "auto"),
        trust_pickle=getattr(args, "trust_pickle", False),
        eval_data=getattr(args, "eval_data", None),
    )


def search_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The search config fields the search options set (None: the config's value)."""
    objectives = split_list(args.objectives)
    if args.minimize_size:
        objectives = tuple(dict.fromkeys((*(objectives or ("metric", "latency")), "size")))
    return {"pipeline": args.pipeline, "max_drop": args.max_drop, "sampler": args.sampler, "seed": args.seed,
            "objectives": objectives, "runtimes": split_list(args.runtimes), "latency_budget": args.latency_budget,
            "latency_batch": args.latency_batch, "disabled": split_list(args.disable), "exports": args.exports,
            "cache_mb": args.cache_mb, "tail_limit": args.tail_limit, "tail_cosine": args.tail_cosine,
            "workload": args.workload}


def require_recipe(path: str, flag: str) -> None:
    if not Path(path).expanduser().is_file():
        raise ConfigError(f"recipe file not found: {path} ({flag} takes a recipe JSON file, e.g. "
                          "runs/studies/<study>/trial-NNN/recipe.json)")
