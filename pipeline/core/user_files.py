"""The model a user names and the files and options that go with it, checked by their names alone, without torch.

``--model`` is a registered name, ``path/file.py:attr``, ``package.module:attr``, a TorchScript or ``.pt2`` file or
an ``hf:`` directory (:func:`source_kind` tells the file and directory sources apart); ``--input-shape``,
``--inputs-file``, ``--output-kind`` and ``--eval-data`` go with it (:class:`SourceOptions`).
:func:`check_model_reference` finds every problem that the names, the file system and the options together show: a
missing file or directory, an unknown name or module, options that do not fit the model or each other, a model with
no input data. ``python -m paretorch`` runs it before it imports torch (an error costs a fraction of a second), and
:func:`paretorch.pipeline.sources.resolve.resolve_spec` before it loads anything. The loaders raise the same errors
through the functions below when called on their own; what needs a file's contents (an archive that does not load,
a Python spec whose import fails, a malformed table) is theirs alone.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.names import builtin_names, model_entry_points, unknown_model

#: ``hf:path/to/dir``: a local Hugging Face directory.
HF_PREFIX = "hf:"
#: TorchScript files (``torch.jit.save``) and ``torch.export`` programs (``torch.export.save``).
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".jit", ".torchscript")
PT2_SUFFIXES = (".pt2",)
#: ``--eval-data`` files: text tables, and tensor inputs with labels (a directory is a BEIR retrieval set).
TEXT_SUFFIXES = (".tsv", ".csv", ".jsonl")
TENSOR_SUFFIXES = (".pt",)
SourceKind = Literal["torchscript", "pt2", "hf"]
#: How each file source names itself in its errors.
SOURCE_NAMES = {"torchscript": "TorchScript", "pt2": ".pt2"}


@dataclass(frozen=True)
class SourceOptions:
    """Options for file and directory sources (``--input-shape``, ``--inputs-file``, ``--output-kind``)."""

    input_shape: str | None = None
    inputs_file: str | None = None
    output_kind: str = "auto"
    #: Load ``.pt2`` archives whose entries are unpickled (which can run code): ``--trust-pickle``.
    trust_pickle: bool = False
    #: Labelled evaluation data (``--eval-data``): the task metric replaces fidelity (any model form).
    eval_data: str | None = None

    @property
    def given(self) -> list[str]:
        """The options set to something other than their default, as CLI flags."""
        names = []
        if self.input_shape:
            names.append("--input-shape")
        if self.inputs_file:
            names.append("--inputs-file")
        if self.output_kind != "auto":
            names.append("--output-kind")
        return names


def source_kind(ref: str) -> SourceKind | None:
    """``"torchscript"``, ``"pt2"``, ``"hf"``, or None when ``ref`` is not one of these sources."""
    if ref.startswith(HF_PREFIX):
        return "hf"
    if ":" in ref:  # path/file.py:attr and package.module:attr belong to the Python resolver
        return None
    suffix = Path(ref).suffix.lower()
    if suffix in PT2_SUFFIXES:
        return "pt2"
    if suffix in TORCHSCRIPT_SUFFIXES:
        return "torchscript"
    return None


def names_a_file(target: str) -> bool:
    """Whether the part before ``:`` of a Python reference is a file (``path/file.py:attr``), not a module."""
    return target.endswith(".py") or "/" in target or "\\" in target or Path(target).exists()


def check_model_reference(ref: str, options: SourceOptions) -> None:
    """Every problem of ``--model ref`` with ``options`` that needs no file opened: one :class:`SpecError`."""
    ref = ref.strip()
    if not ref:
        raise SpecError(f"no model given: pass MODEL=<name> (built-ins: {', '.join(builtin_names())})")
    if options.eval_data:
        check_eval_data(Path(options.eval_data).expanduser())
    kind = source_kind(ref)
    if kind is None:
        _check_python_reference(ref, options)
    elif kind == "hf":
        _check_hf_reference(hf_directory(ref), options)
    else:
        _check_model_file(Path(ref).expanduser(), kind, options)


def _check_python_reference(ref: str, options: SourceOptions) -> None:
    if options.given:
        raise SpecError(f"{' and '.join(options.given)}: only for TorchScript (.pt), .pt2 and hf: models, "
                        f"not for '{ref}' (a Python spec brings its own data)")
    if ":" in ref:
        target = ref.rpartition(":")[0]
        if names_a_file(target):
            require_model_file(Path(target).expanduser(), "check the path before ':'")
        elif not (top := target.partition(".")[0]) or importlib.util.find_spec(top) is None:  # imports nothing
            raise module_not_found(target)
    elif ref not in model_entry_points():
        if ref.endswith(".py") or Path(ref).exists():
            raise SpecError(f"model '{ref}' names a file but no attribute: use '{ref}:<attr>' (a ModelSpec or a "
                            "function returning one)")
        raise unknown_model(ref)


def _check_hf_reference(directory: Path, options: SourceOptions) -> None:
    require_hf_directory(directory)
    if options.input_shape:
        raise hf_input_shape()
    if options.inputs_file:
        require_inputs_file(Path(options.inputs_file).expanduser(), text=True)
    elif not options.eval_data:
        raise hf_needs_inputs(directory)


def _check_model_file(path: Path, kind: SourceKind, options: SourceOptions) -> None:
    require_model_file(path)
    if options.input_shape and options.inputs_file:
        raise both_input_options()
    if options.eval_data and holds_text(Path(options.eval_data).expanduser()):
        raise text_data_for_tensors(str(Path(options.eval_data).expanduser()), kind)
    if options.inputs_file:
        require_inputs_file(Path(options.inputs_file).expanduser(), text=False)
    elif not options.input_shape and not options.eval_data:
        raise no_input_data(f"{SOURCE_NAMES[kind]} file {path}")


def hf_directory(ref: str) -> Path:
    """The directory of ``hf:path/to/dir``."""
    return Path(ref.removeprefix(HF_PREFIX)).expanduser()


def require_model_file(path: Path, hint: str = "") -> None:
    """A model file (TorchScript, ``.pt2``, the ``file.py`` of ``file.py:attr``) that must exist; ``hint``: what to
    check (default: the path, or a registered name instead)."""
    if not path.is_file():
        hint = hint or f"check the path, or pass a registered model: {', '.join(builtin_names())}"
        raise SpecError(f"model file not found: {path} ({hint})")


def require_hf_directory(directory: Path) -> None:
    """An ``hf:`` directory that exists and holds ``config.json`` (its weights and tokenizer load later)."""
    if not directory.is_dir():
        raise SpecError(f"hf: directory not found: {directory} (pass hf:path/to/a/local/model/directory)")
    if not (directory / "config.json").is_file():
        raise SpecError(f"hf:{directory} has no config.json: point hf: at the directory that holds config.json, the "
                        "weights and the tokenizer files (e.g. one written by save_pretrained)")


def require_inputs_file(path: Path, text: bool) -> None:
    """``--inputs-file``: a UTF-8 text file (``hf:`` models, ``text``) or a ``torch.save`` file (TorchScript, .pt2)."""
    if not path.is_file():
        what = "a UTF-8 text file with one input per line" if text else \
            "a .pt file saved with torch.save(tensor_or_tuple, path)"
        raise SpecError(f"inputs file not found: {path} (pass {what})")


def check_eval_data(path: Path) -> None:
    """``--eval-data``: a BEIR directory, or a file of a format :mod:`paretorch.pipeline.core.task_data` reads."""
    if path.is_dir():
        return
    if not path.is_file():
        raise SpecError(f"--eval-data {path}: no such file or directory (a .tsv/.csv/.jsonl table, a .pt file "
                        "or a BEIR retrieval directory)")
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES + TENSOR_SUFFIXES:
        raise SpecError(f"--eval-data {path}: unknown format '{suffix or path.name}': use .tsv, .csv or .jsonl "
                        "(text tables), .pt (tensor inputs and labels) or a BEIR directory (retrieval)")


def holds_text(path: Path) -> bool:
    """Whether ``--eval-data`` at ``path`` holds texts (a table or a BEIR directory), not tensors."""
    return path.is_dir() or path.suffix.lower() in TEXT_SUFFIXES


def module_not_found(name: str) -> SpecError:
    return SpecError(f"module '{name}' not found: is it installed or on PYTHONPATH?")


def hf_needs_inputs(directory: Path) -> SpecError:
    return SpecError(f"hf:{directory} needs --inputs-file (a UTF-8 text file with one input per line) "
                     "or --eval-data (labelled texts)")


def hf_input_shape() -> SpecError:
    return SpecError("--input-shape does not apply to hf: models: pass --inputs-file with one text per line")


def both_input_options() -> SpecError:
    return SpecError("give either --input-shape or --inputs-file, not both")


def no_input_data(source: str) -> SpecError:
    return SpecError(f"{source} carries no input data: pass --input-shape (e.g. 1x3x224x224), "
                     "--inputs-file (a .pt file of a tensor or tuple of tensors) "
                     "or --eval-data (a .pt file of inputs and labels)")


def text_data_for_tensors(source: str, kind: str) -> SpecError:
    return SpecError(f"--eval-data {source} holds text; a {kind} model takes tensors: pass a .pt file "
                     "torch.save({'inputs': tensor_or_tuple, 'labels': int_tensor}, path)")
