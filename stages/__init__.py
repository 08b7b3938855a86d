"""Pipeline stages. Importing this package registers every built-in stage."""

from __future__ import annotations

from stages.registry import (
    ExportResult,
    StageConfig,
    StageContext,
    apply,
    apply_stage,
    config_from_dict,
    get_stage,
    register_stage,
    registered_stages,
    run_chain,
)

__all__ = [
    "ExportResult",
    "StageConfig",
    "StageContext",
    "apply",
    "apply_stage",
    "config_from_dict",
    "get_stage",
    "register_stage",
    "registered_stages",
    "run_chain",
]

# Importing the built-in stages registers them (order is the default pipeline order).
from stages import amp, export, prune, quantize  # noqa: F401  (registration side effect)
