"""A content-addressed cache of node outputs, so trials that share a prefix reuse it.

A node's key is a hash of (operation, config, the keys of its inputs, device
type, library versions): two trials with the same prune config and different
quantization share the pruned model. The versions are those the node depends on: torch
and the project's own always, plus the libraries its stage or runtime declares (and the
distribution that provides it), plus, for the source model, the distributions defining its
modules; a node's inputs' keys carry theirs, so a key covers its chain's libraries and no
other (installing an unrelated runtime changes no key). Models and evaluation reports live in
memory (models under a byte bound, least recently used evicted first); exports
live on disk under ``<results>/cache/exports/<key>/``, written to a staging
directory and renamed into place, so a half-written export is never a hit. The staging
directories of a process that was killed (or interrupted mid-export) are removed when a
cache is next opened on the folder (:meth:`NodeCache.remove_stale_staging`).

Infeasible results are never cached (the runner only stores what succeeded).
A failed cache write raises :class:`CacheWriteError`: it is an error, not a log line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn

from paretorch.pipeline.core.device import int8_products_saturate
from paretorch.pipeline.core.errors import PipelineError
from paretorch.pipeline.core.names import RUNTIME_ENTRY_POINT_GROUP as RUNTIME_GROUP
from paretorch.pipeline.core.processes import process_exists
from paretorch.pipeline.core.runtimes.base import Runtime
from paretorch.pipeline.core.stage import ENTRY_POINT_GROUP as STAGE_GROUP
from paretorch.pipeline.core.stage import ExportResult, Stage, StageConfig, config_from_dict, get_stage

#: Keyed on every node: torch and the project's own distribution (the engine, the evaluation, the built-ins).
ALWAYS_KEYED = ("torch", "paretorch")
DEFAULT_MEMORY_BYTES = 2 * 1024**3
MANIFEST = "manifest.json"
#: ``.<key>.staging-<pid>``: where a process writes an export before it is renamed into the cache.
STAGING_MARK = ".staging-"


class CacheWriteError(PipelineError):
    """An export could not be stored in the cache (disk full, permissions ...)."""


@cache
def installed_version(distribution: str) -> str:
    """The installed version of ``distribution`` ('none' when it is not installed)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "none"


@cache
def provider(group: str, name: str) -> tuple[str, ...]:
    """The distribution that declares the entry point ``name`` in ``group`` (a plugin's stage or runtime: its own
    code shapes what the node produces); empty for one registered in code."""
    return tuple(ep.dist.name for ep in metadata.entry_points(group=group, name=name) if ep.dist is not None)


def stage_libraries(stage: Stage[StageConfig]) -> tuple[str, ...]:
    """What a node of ``stage`` is keyed on: the libraries it declares and the distribution that provides it."""
    return (*stage.libraries, *provider(STAGE_GROUP, stage.name))


def runtime_libraries(runtime: Runtime) -> tuple[str, ...]:
    """What an evaluation under ``runtime`` is keyed on: its declared libraries, its distribution's, and those of
    the export stage it reads."""
    export = stage_libraries(get_stage(runtime.export.stage)) if runtime.export is not None else ()
    return (*runtime.libraries, *provider(RUNTIME_GROUP, runtime.name), *export)


def model_libraries(model: nn.Module) -> tuple[str, ...]:
    """The distributions whose code defines ``model``'s modules (transformers for a Hugging Face model): its
    forward changes with their versions, its weights do not."""
    packages = {type(module).__module__.partition(".")[0] for module in model.modules()}
    return tuple(sorted({dist for package in packages for dist in _installed_from(package)}))


@cache
def _installed_from(package: str) -> tuple[str, ...]:
    """The distributions whose installed files hold the imported top-level ``package`` itself (a checkout's own
    ``tests`` package is not the ``tests`` folder some wheel also ships)."""
    origin = getattr(sys.modules.get(package), "__file__", None)
    if origin is None:
        return ()
    target, found = Path(origin).resolve(), []
    for name in _package_owners().get(package, ()):
        dist = metadata.distribution(name)
        root = Path(str(dist.locate_file(""))).resolve()
        listed = {file.as_posix() for file in dist.files or ()}
        if target.is_relative_to(root) and target.relative_to(root).as_posix() in listed:
            found.append(name)
    return tuple(found)


@cache
def _package_owners() -> Mapping[str, list[str]]:
    """Top-level import names -> the distributions that install them (read once: it lists every installed file)."""
    return metadata.packages_distributions()


def library_versions(libraries: Iterable[str] = ()) -> dict[str, str]:
    """The installed versions of :data:`ALWAYS_KEYED` and ``libraries`` (absent ones: 'none')."""
    return {name: installed_version(name) for name in sorted({*ALWAYS_KEYED, *libraries})}


def node_key(op: str, config: Mapping[str, object] | None, input_keys: tuple[str, ...], device_type: str,
             libraries: Iterable[str] = ()) -> str:
    """The content key of one node output: its operation, config, inputs' keys (which hold the chain's own
    libraries), device type (on a CPU, whether its int8 products saturate:
    :func:`~paretorch.pipeline.core.device.int8_products_saturate`), and the versions of the ``libraries`` the node
    itself depends on (its stage's or runtime's declaration) plus :data:`ALWAYS_KEYED`, so an unrelated installed
    plugin changes no key."""
    payload = json.dumps(
        {"op": op, "config": config, "inputs": list(input_keys), "device": device_type,
         "versions": library_versions(libraries),
         # ONNX Runtime int8 takes 7-bit weights on such CPUs: an export made on one host is not another's.
         "int8_products_saturate": device_type == "cpu" and int8_products_saturate()},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def model_digest(model: nn.Module) -> str:
    """A hash of the model's class and state (parameters and buffers): the source node's key."""
    digest = hashlib.sha256(f"{type(model).__module__}.{type(model).__qualname__}".encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        if isinstance(tensor, torch.Tensor):
            data = tensor.detach().cpu().contiguous()
            digest.update(f"{data.dtype}{tuple(data.shape)}".encode())
            digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:24]


def model_bytes(model: nn.Module) -> int:
    """Approximate memory of a model's parameters and buffers (quantized tensors included)."""
    total = 0
    for tensor in model.state_dict().values():
        if isinstance(tensor, torch.Tensor):
            try:
                total += tensor.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError, TypeError):
                total += tensor.numel() * tensor.element_size()
    return total


@dataclass
class CachedOutput:
    """A stored node output with what the stage resolved and recorded while making it."""

    value: Any
    resolved_config: StageConfig | None = None
    records: dict[str, Any] = field(default_factory=dict)
    nbytes: int = 0


@dataclass
class CacheStats:
    """Hits and misses per kind of output (``model``, ``export``, ``evaluation``)."""

    hits: Counter[str] = field(default_factory=Counter)
    misses: Counter[str] = field(default_factory=Counter)
    evictions: int = 0

    @property
    def total_hits(self) -> int:
        return sum(self.hits.values())

    @property
    def total_misses(self) -> int:
        return sum(self.misses.values())

    def describe(self) -> str:
        kinds = sorted(set(self.hits) | set(self.misses))
        per_kind = ", ".join(f"{k} {self.hits[k]}/{self.hits[k] + self.misses[k]}" for k in kinds)
        return f"{self.total_hits} hits, {self.total_misses} misses ({per_kind or 'nothing run'})"

    def as_dict(self) -> dict[str, int]:
        data = {f"cache_hits_{k}": v for k, v in self.hits.items()}
        data.update({f"cache_misses_{k}": v for k, v in self.misses.items()})
        data.update(cache_hits=self.total_hits, cache_misses=self.total_misses)
        return data


class NodeCache:
    """Models and reports in memory (LRU under ``memory_bytes``), exports on disk under ``export_dir``."""

    def __init__(self, memory_bytes: int = DEFAULT_MEMORY_BYTES, export_dir: Path | None = None) -> None:
        if memory_bytes < 0:
            raise ValueError(f"memory_bytes must be >= 0, got {memory_bytes}")
        self.memory_bytes = memory_bytes
        self.export_dir = export_dir
        self.stats = CacheStats()
        self._memory: OrderedDict[str, CachedOutput] = OrderedDict()
        self._used = 0
        self.removed_staging = self.remove_stale_staging()

    # ------------------------------------------------------------------ memory (models, reports)

    def get(self, key: str, kind: str) -> CachedOutput | None:
        entry = self._memory.get(key)
        if entry is None:
            self.stats.misses[kind] += 1
            return None
        self._memory.move_to_end(key)
        self.stats.hits[kind] += 1
        return entry

    def put(self, key: str, entry: CachedOutput) -> None:
        """Keep ``entry``; least recently used entries go first when over the byte bound.
        An entry larger than the whole bound is not kept."""
        if key in self._memory:
            self._used -= self._memory.pop(key).nbytes
        if entry.nbytes > self.memory_bytes:
            return
        self._memory[key] = entry
        self._used += entry.nbytes
        while self._used > self.memory_bytes:
            _, evicted = self._memory.popitem(last=False)
            self._used -= evicted.nbytes
            self.stats.evictions += 1

    @property
    def memory_used(self) -> int:
        return self._used

    # ------------------------------------------------------------------ disk (exports)

    def _require_export_dir(self) -> Path:
        if self.export_dir is None:
            raise CacheWriteError("this cache has no export directory: give NodeCache an export_dir")
        return self.export_dir

    def get_export(self, key: str) -> CachedOutput | None:
        """A committed export entry (its manifest and files), or None."""
        entry_dir = self._require_export_dir() / key
        manifest = entry_dir / MANIFEST
        if not manifest.is_file():
            self.stats.misses["export"] += 1
            return None
        data = json.loads(manifest.read_text())
        result = data["result"]
        result["path"] = entry_dir / result["path"]
        if not result["path"].exists():
            self.stats.misses["export"] += 1
            return None
        self.stats.hits["export"] += 1
        resolved = data.get("resolved_config")
        return CachedOutput(value=ExportResult(**result),
                            resolved_config=config_from_dict(resolved) if resolved else None,
                            records=data.get("records", {}))

    def remove_stale_staging(self) -> list[Path]:
        """Remove the staging directories whose process is gone (killed, or interrupted mid-export); the
        removed ones. Those of live processes (other workers exporting now) stay."""
        if self.export_dir is None or not self.export_dir.is_dir():
            return []
        removed = []
        for path in sorted(self.export_dir.glob(f".*{STAGING_MARK}*")):
            pid = path.name.rpartition(STAGING_MARK)[2]
            if pid.isdigit() and not process_exists(int(pid)):
                shutil.rmtree(path)
                removed.append(path)
        return removed

    def discard_staging(self, staging: Path) -> None:
        """Remove ``staging`` after an export that did not finish (it failed, or was interrupted)."""
        shutil.rmtree(staging, ignore_errors=True)  # the export's own error is the one raised

    def staging_dir(self, key: str) -> Path:
        """A fresh, empty directory where an export stage writes before :meth:`commit_export`."""
        path = self._require_export_dir() / f".{key}{STAGING_MARK}{os.getpid()}"
        try:
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
        except OSError as exc:
            raise CacheWriteError(f"cannot create the export staging directory {path}: {exc}") from exc
        return path

    def commit_export(self, key: str, staging: Path, entry: CachedOutput) -> CachedOutput:
        """Move a finished export from ``staging`` into the cache; returns the entry with its final path."""
        result: ExportResult = entry.value
        final = self._require_export_dir() / key
        try:
            source = Path(result.path).resolve()
            if not source.is_relative_to(staging.resolve()):
                # The exporter wrote elsewhere: bring the file (or package directory) into the entry.
                target = staging / source.name
                if source.is_dir():
                    shutil.copytree(source, target)
                else:
                    shutil.copy2(source, target)
                source = target.resolve()
            relative = source.relative_to(staging.resolve())
            manifest = {
                "result": {**asdict(result), "path": str(relative)},
                "resolved_config": entry.resolved_config.to_dict() if entry.resolved_config else None,
                "records": _jsonable(entry.records),
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
        except OSError as exc:
            raise CacheWriteError(f"storing export {result.format} in {final} failed: {exc}") from exc
        committed = ExportResult(**{**asdict(result), "path": final / relative})
        return CachedOutput(value=committed, resolved_config=entry.resolved_config, records=entry.records)


def _jsonable(records: Mapping[str, object]) -> dict[str, object]:
    """Records as JSON: values that are not JSON-ready become their ``str``."""
    out = {}
    for key, value in records.items():
        try:
            json.dumps(value)
            out[key] = value
        except TypeError:
            out[key] = str(value)
    return out
