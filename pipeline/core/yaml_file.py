"""The YAML files a user passes (``--search-config``, ``--pipeline``), read with one-line errors and without torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from paretorch.pipeline.core.errors import ConfigError


def read_yaml(path: Path, flag: str) -> Any:
    """The document in the YAML file ``path``. A file that cannot be read or is not YAML is one :class:`ConfigError`
    line: where the syntax breaks (line, column), the problem, and ``flag`` (what to pass instead)."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}; fix the file or pass another {flag}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else f"not UTF-8 text ({exc.reason})"
        raise ConfigError(f"cannot read {path}: {reason}; pass a readable YAML file to {flag}") from exc
