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
