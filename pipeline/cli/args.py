"""The model that the command line names (``--model`` and the source options), resolved."""

from __future__ import annotations

import argparse

from paretorch.pipeline.cli.checks import source_options
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.sources.resolve import resolve_spec


def spec_from_args(args: argparse.Namespace) -> ModelSpec:
    """The ModelSpec named by ``--model`` (and any source options), resolved and checked."""
    return resolve_spec(args.model, source_options(args))
