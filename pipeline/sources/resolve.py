"""Turn a ``MODEL=`` string into a checked :class:`ModelSpec`.

Accepted forms:

* a registered name: ``digits`` -> the ``paretorch.models`` entry point of that name (the built-ins
  declare theirs in ``pyproject.toml``, like the stages; an installed package may add its own);
* ``path/to/file.py:attr``;
* ``package.module:attr``;
* a TorchScript file (``model.pt``), a ``.pt2`` ExportedProgram, or
  ``hf:path/to/dir`` (see :mod:`paretorch.pipeline.sources`; these take
  :class:`~paretorch.pipeline.sources.SourceOptions`: ``--input-shape`` / ``--inputs-file``).

``attr`` is a :class:`ModelSpec` or a zero-argument callable returning one.
Every failure raises :class:`SpecError` with one line saying what was tried and
what to do, before any search starts: first what the names, the file system and the options show
(:func:`paretorch.pipeline.core.user_files.check_model_reference`, which ``python -m paretorch`` runs before it
imports torch), then what loading the model shows.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from torch import nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.names import model_entry_points
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.task_data import load_task_data
from paretorch.pipeline.core.task_spec import given_texts, with_task_data
from paretorch.pipeline.core.user_files import check_model_reference, module_not_found, names_a_file
from paretorch.pipeline.sources import SourceOptions, resolve_source

#: Resolvers for other model sources (TorchScript, .pt2, hf:...): each takes the
#: reference and the source options and returns a spec, or None if it is not theirs.
SOURCE_RESOLVERS: list[Callable[[str, SourceOptions], ModelSpec | None]] = [resolve_source]


def resolve_spec(ref: str, options: SourceOptions | None = None) -> ModelSpec:
    """Resolve ``ref`` to a ModelSpec (not yet built; see :func:`load_model`).

    ``options`` (``--input-shape``, ``--inputs-file``, ``--output-kind``) apply
    only to the file and directory sources; given with a Python spec they are
    an error rather than silently ignored.
    """
    ref = ref.strip()
    options = options or SourceOptions()
    check_model_reference(ref, options)
    return attach_eval_data(_resolve(ref, options), options)


def attach_eval_data(spec: ModelSpec, options: SourceOptions) -> ModelSpec:
    """``spec`` scored on ``--eval-data`` when given (every model form), else as it is."""
    if not options.eval_data:
        return spec
    data = load_task_data(options.eval_data)
    scored = with_task_data(spec, data, spec.label_names)
    if scored.evaluation_texts:  # the workload is timed on the user's own texts (paretorch.pipeline.core.workload)
        texts = given_texts(data)  # in the file's order: the evaluation's rows may be sorted by length
        scored = dataclasses.replace(scored, latency_texts=lambda: texts)
    # The source names the data too: a study scored on labels is not the fidelity study of the same model.
    object.__setattr__(scored, "source", f"{spec.source or spec.name} --eval-data {options.eval_data}")
    return scored


def _resolve(ref: str, options: SourceOptions) -> ModelSpec:
    """The spec of a reference :func:`check_model_reference` passed: a file or directory source, ``file.py:attr``,
    ``module:attr`` or a registered name."""
    for resolver in SOURCE_RESOLVERS:
        spec = resolver(ref, options)
        if spec is not None:
            return spec
    if ":" in ref:
        target, _, attr = ref.rpartition(":")
        module = _import_file(target) if names_a_file(target) else _import_module(target)
        return _spec_from_attr(module, attr, ref)
    return _spec_from_value(_load_entry_point(model_entry_points()[ref]), ref)


def _import_file(path_text: str) -> ModuleType:
    path = Path(path_text).expanduser()
    name = f"_paretorch_user_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise SpecError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # the user's module: quote its error, whatever it is
        sys.modules.pop(name, None)
        raise SpecError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise module_not_found(name) from exc
        raise SpecError(f"importing module '{name}' failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise SpecError(f"importing module '{name}' failed: {type(exc).__name__}: {exc}") from exc


def _load_entry_point(entry_point: importlib.metadata.EntryPoint) -> object:
    try:
        return entry_point.load()
    except Exception as exc:  # the package's import error, whatever it is
        raise SpecError(f"model entry point '{entry_point.name}' ({entry_point.value}) failed to load: "
                        f"{type(exc).__name__}: {exc}") from exc


def _spec_from_attr(module: ModuleType, attr: str, ref: str) -> ModelSpec:
    if not attr:
        raise SpecError(f"model '{ref}' has an empty attribute after ':'")
    if not hasattr(module, attr):
        public = sorted(a for a in vars(module) if not a.startswith("_"))
        raise SpecError(f"'{ref}': module has no attribute '{attr}' (it has: {', '.join(public[:12])})")
    return _spec_from_value(getattr(module, attr), ref)


def _spec_from_value(value: object, ref: str) -> ModelSpec:
    """``value`` (a ModelSpec or a zero-argument function returning one) as a checked spec named by ``ref``."""
    if not isinstance(value, ModelSpec):
        if not callable(value) or isinstance(value, type | nn.Module):
            raise SpecError(
                f"'{ref}' is a {type(value).__name__}, not a ModelSpec or a zero-argument function returning one"
            )
        try:
            value = value()
        except TypeError as exc:
            raise SpecError(f"calling '{ref}' failed: {exc} (it must take no arguments)") from exc
        except Exception as exc:
            raise SpecError(f"calling '{ref}' failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(value, ModelSpec):
            raise SpecError(f"'{ref}' returned a {type(value).__name__}, not a ModelSpec")
    if not value.source:
        object.__setattr__(value, "source", ref)
    return value
