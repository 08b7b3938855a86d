"""The model that the command line names (``--model`` and the source options), resolved."""

from __future__ import annotations

import argparse

from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.sources import SourceOptions
from paretorch.pipeline.sources.resolve import resolve_spec


def spec_from_args(args: argparse.Namespace) -> ModelSpec:
    """The ModelSpec named by ``--model`` (and any source options), resolved and checked."""
    options = SourceOptions(
        input_shape=getattr(args, "input_shape", None),
        inputs_file=getattr(args, "inputs_file", None),
        output_kind=getattr(args, "output_kind", "auto"),
        trust_pickle=getattr(args, "trust_pickle", False),
        eval_data=getattr(args, "eval_data", None),
    )
    return resolve_spec(args.model, options)
