"""Inputs for models that come without data: ``--input-shape``, a ``.pt`` inputs file, a text file.

* ``--input-shape 1x3x224x224`` (several inputs: ``1x3x224x224,1x10``): the
  first dimension is the batch and is replaced; every input is float32 drawn
  from a standard normal distribution with a fixed seed.
* ``--inputs-file inputs.pt``: a tensor, or a tuple/list of tensors, saved with
  ``torch.save``; the first dimension of each is the batch. Its samples are
  evaluation inputs; other inputs (calibration, more evaluation samples up to
  :data:`MIN_EVALUATION_SAMPLES`) are generated like them: same shape and dtype,
  floats from a normal distribution with the file's mean and std, integers
  uniform in the file's [min, max].
* ``--inputs-file lines.txt`` (for ``hf:`` models): one input text per line.

Calibration and evaluation inputs never overlap: they come from different seeds.
"""

from __future__ import annotations

import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.spec import Batch, split_batches, tile
from paretorch.pipeline.core.user_files import both_input_options, no_input_data, require_inputs_file

#: Generated evaluation set size for models without data (fixed seed).
MIN_EVALUATION_SAMPLES = 128
CALIBRATION_SAMPLES = 32
#: Generated inputs (the evaluation samples) may take at most this much memory.
MAX_GENERATED_BYTES = 4 * 1024**3
SEEDS = {"evaluation": 0, "calibration": 1, "example": 2}

_DIMENSION = re.compile(r"^[1-9][0-9]*$")


@dataclass(frozen=True)
class InputTemplate:
    """How to generate one positional input: per-sample shape, dtype and value range."""

    sample_shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    mean: float = 0.0
    std: float = 1.0
    low: int = 0
    high: int = 1

    def generate(self, count: int, generator: torch.Generator) -> Tensor:
        shape = (count, *self.sample_shape)
        if self.dtype.is_floating_point:
            return (torch.randn(shape, generator=generator) * self.std + self.mean).to(self.dtype)
        if self.dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=generator).bool()
        return torch.randint(self.low, self.high + 1, shape, generator=generator, dtype=torch.int64).to(self.dtype)


def parse_input_shape(text: str) -> tuple[InputTemplate, ...]:
    """``"1x3x224x224"`` or ``"1x3x224x224,1x10"`` -> float32 templates (batch dimension dropped)."""
    cleaned = text.strip().replace(" ", "")
    if not cleaned:
        raise SpecError("--input-shape is empty: give the shape of one input batch, e.g. 1x3x224x224")
    templates = []
    for part in cleaned.split(","):
        dims = part.lower().split("x")
        if not all(_DIMENSION.match(d) for d in dims):
            raise SpecError(
                f"bad --input-shape '{text}': '{part}' is not positive integers joined by 'x' "
                "(e.g. 1x3x224x224; several inputs: 1x3x224x224,1x10)"
            )
        templates.append(InputTemplate(sample_shape=tuple(int(d) for d in dims[1:])))
    needed = MIN_EVALUATION_SAMPLES * sum(4 * math.prod(t.sample_shape) for t in templates)
    if needed > MAX_GENERATED_BYTES:
        raise SpecError(f"--input-shape {text}: {MIN_EVALUATION_SAMPLES} generated float32 samples of that shape "
                        f"need about {needed / 1024**3:,.1f} GiB (limit {MAX_GENERATED_BYTES / 1024**3:.0f} GiB); "
                        "give the shape of one real input batch, e.g. 1x3x224x224")
    return tuple(templates)


def load_inputs_file(path_text: str) -> tuple[Batch, tuple[InputTemplate, ...]]:
    """A ``.pt`` file of a tensor or a tuple/list of tensors -> (the samples, templates like them)."""
    path = Path(path_text).expanduser()
    require_inputs_file(path, text=False)
    if not zipfile.is_zipfile(path):
        raise SpecError(
            f"inputs file {path} is not a torch.save file: for TorchScript/.pt2 models pass "
            "torch.save(tensor_or_tuple_of_tensors, path) (a text file of inputs is for hf: models)"
        )
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unreadable file: say which and why, in one line
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(
            f"cannot read inputs file {path}: {first_line[:200]} "
            "(it must be torch.save(tensor_or_tuple_of_tensors, path))"
        ) from exc
    tensors = (loaded,) if isinstance(loaded, Tensor) else loaded
    if not isinstance(tensors, tuple | list) or not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise SpecError(
            f"inputs file {path} holds a {type(loaded).__name__}, not a tensor or a tuple/list of tensors"
        )
    batch = tuple(t.detach().contiguous() for t in tensors)
    if any(t.dim() == 0 for t in batch):
        raise SpecError(f"inputs file {path}: every tensor needs a batch dimension first (got a 0-dim tensor)")
    sizes = {int(t.shape[0]) for t in batch}
    if len(sizes) != 1 or 0 in sizes:
        raise SpecError(
            f"inputs file {path}: the tensors' first (batch) dimensions must be equal and > 0, got {sorted(sizes)}"
        )
    return batch, tuple(_template_like(t) for t in batch)


def _template_like(tensor: Tensor) -> InputTemplate:
    sample_shape = tuple(tensor.shape[1:])
    if tensor.is_floating_point():
        values = tensor.float()
        std = float(values.std()) if values.numel() > 1 else 1.0
        return InputTemplate(sample_shape, tensor.dtype, mean=float(values.mean()), std=std if std > 0 else 1.0)
    if tensor.dtype == torch.bool:
        return InputTemplate(sample_shape, tensor.dtype)
    return InputTemplate(sample_shape, tensor.dtype, low=int(tensor.min()), high=int(tensor.max()))


def read_text_inputs(path_text: str) -> list[str]:
    """Non-empty, distinct lines of a UTF-8 text file, in file order."""
    path = Path(path_text).expanduser()
    require_inputs_file(path, text=True)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"inputs file {path} is not UTF-8 text (one input per line): {exc.reason}") from exc
    lines = list(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))
    if len(lines) < 2:
        raise SpecError(
            f"inputs file {path} has {len(lines)} distinct non-empty line(s): give at least 2 inputs, one per line "
            "(some for calibration, the rest for evaluation)"
        )
    return lines


def generate(templates: tuple[InputTemplate, ...], count: int, seed: int) -> Batch:
    """``count`` samples per input, reproducibly from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(template.generate(count, generator) for template in templates)


@dataclass(frozen=True)
class TensorInputs:
    """Evaluation, calibration and latency inputs of a model that came as a file."""

    templates: tuple[InputTemplate, ...]
    #: Real samples from an inputs file (evaluated first), or None for generated-only.
    samples: Batch | None = None

    @classmethod
    def from_options(cls, input_shape: str | None, inputs_file: str | None, source: str,
                     eval_samples: Batch | None = None) -> TensorInputs:
        """From ``--input-shape`` or ``--inputs-file``; else from the inputs of ``--eval-data`` (``eval_samples``)."""
        if input_shape and inputs_file:
            raise both_input_options()
        if inputs_file:
            samples, templates = load_inputs_file(inputs_file)
            return cls(templates=templates, samples=samples)
        if input_shape:
            return cls(templates=parse_input_shape(input_shape))
        if eval_samples is not None:
            return cls(templates=tuple(_template_like(t) for t in eval_samples), samples=eval_samples)
        raise no_input_data(source)

    def evaluation(self) -> list[Batch]:
        parts: list[Batch] = []
        have = 0
        if self.samples is not None:
            parts.append(self.samples)
            have = int(self.samples[0].shape[0])
        if have < MIN_EVALUATION_SAMPLES:
            parts.append(generate(self.templates, MIN_EVALUATION_SAMPLES - have, SEEDS["evaluation"]))
        merged = tuple(torch.cat(tensors) for tensors in zip(*parts, strict=True))
        return split_batches(merged)

    def calibration(self) -> list[Batch]:
        return split_batches(generate(self.templates, CALIBRATION_SAMPLES, SEEDS["calibration"]))

    def example_inputs(self, batch_size: int) -> Batch:
        if self.samples is not None:
            return tile(self.samples, batch_size)
        return generate(self.templates, batch_size, SEEDS["example"])
