"""What in a ``.pt2`` archive would run code on ``torch.export.load``, found without unpickling anything.

torch 2.13's loader unpickles (``weights_only=False`` or plain :mod:`pickle`): weights and constants
marked ``use_pickle``, custom-object and opaque-object constants, and any ``.pt`` payload (sample
inputs, legacy weight/constant files) that the safe loader (``weights_only=True``) refuses. It can
also carry compiled libraries (``.so``). :func:`code_entries` lists such entries; the source refuses
the file unless the user trusts it (``--trust-pickle``).
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import torch

#: Constant file-name prefixes that torch.export.load unpickles (torch/export/pt2_archive/constants.py).
PICKLED_CONSTANT_PREFIXES = ("custom_obj_", "opaque_obj_")
TRUST_FLAG = "--trust-pickle"


def _config_entries(data: object) -> list[tuple[str, dict[str, object]]]:
    config = data.get("config", {}) if isinstance(data, dict) else {}
    return [(str(k), v) for k, v in config.items() if isinstance(v, dict)] if isinstance(config, dict) else []


def _safe_torch_load(payload: bytes) -> bool:
    """True if ``payload`` loads with the restricted unpickler (which runs no code)."""
    try:
        torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception:  # any refusal means the real loader would fall back to weights_only=False
        return False
    return True


def code_entries(path: Path) -> list[str]:
    """Entries of the ``.pt2`` zip at ``path`` that would be unpickled (or loaded as native code) on load."""
    found: list[str] = []
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            inner = name.split("/", 1)[1] if "/" in name else name
            if inner.endswith(".so"):
                found.append(f"{inner} (a compiled library)")
            elif inner.endswith("_config.json") and inner.startswith("data/"):
                try:
                    entries = _config_entries(json.loads(archive.read(name)))
                except ValueError:
                    found.append(f"{inner} (unreadable config)")
                    continue
                for key, meta in entries:
                    path_name = str(meta.get("path_name", ""))
                    if meta.get("use_pickle") or path_name.startswith(PICKLED_CONSTANT_PREFIXES):
                        found.append(f"{inner}: {key} (pickled)")
            elif inner.endswith(".pt") and inner.startswith("data/") and not _safe_torch_load(archive.read(name)):
                found.append(f"{inner} (pickled objects beyond tensors)")
    return found


def untrusted_message(path: Path, entries: list[str]) -> str:
    shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
    return (f"{path} asks to unpickle {shown}: loading it could run code, so it was not loaded. "
            f"Re-export it with torch.export.save from plain tensors, or pass {TRUST_FLAG} if you trust its author")
