"""What a stage may read besides the model (:class:`StageContext`) and what an export stage hands back
(:class:`ExportResult`). Part of the stage API; plugins import them from :mod:`paretorch.pipeline.core.stage`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from paretorch.pipeline.core.device import Capabilities, capabilities
from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.latency import LatencySettings, default_latency
from paretorch.pipeline.core.model_facts import ModelFacts
from paretorch.pipeline.core.spec import Batch, ModelSpec, move_batch
from paretorch.pipeline.core.stage_config import StageConfig

C = TypeVar("C", bound=StageConfig)
T = TypeVar("T")


@dataclass(frozen=True)
class ExportResult:
    """What an export stage produced: a file or package, and how it was checked."""

    format: str
    path: Path
    size_bytes: int
    #: How the export was checked, said plainly: e.g. "reloaded; inputs/outputs checked
    #: (predict needs macOS)" or "onnxruntime matches torch (max abs err 2e-6)".
    validation: str
    metrics: dict[str, float] = field(default_factory=dict)
    #: A pack recipe's file (the padded graph): the padding-mask input a runtime groups rows by, calling the file
    #: once per group of similar-length rows (:mod:`paretorch.pipeline.core.length_groups`); None: called as it is.
    grouped_mask_input: int | None = None


@dataclass
class StageContext:
    """What a stage may read besides the model: the device, the spec's data,
    where to write files, and the recipe so far. Stages record extra results
    (e.g. AMP sensitivities) with :meth:`record` and may hand back the fully
    determined config they applied with :meth:`resolve` (kept in the recipe)."""

    spec: ModelSpec
    device: torch.device
    output_dir: Path | None = None
    #: Resolved configs of the stages applied before this one, in order.
    upstream: tuple[StageConfig, ...] = ()
    records: dict[str, Any] = field(default_factory=dict)
    resolved_config: StageConfig | None = None
    #: For export stages: the model after the structural stages (pruning) but
    #: before the numeric ones (quantize, amp), i.e. the float graph that Core ML
    #: and ONNX convert before mirroring the recipe's compression. None: same as
    #: the model handed to the stage.
    float_model: nn.Module | None = None
    #: Content key of the input model (the runner's cache key: same key, same model),
    #: so a stage may reuse work it did on that model before. None: unknown (scripted use).
    input_key: str | None = None
    #: The unoptimized model the pipeline started from (the runner's source model; do not
    #: modify it), e.g. the teacher of distillation. None: unknown (scripted use of one stage).
    source_model: nn.Module | None = None
    #: What the stages know about the unoptimized model (a search reads them once per study), so that
    #: ``suggest`` offers no choice that cannot change this model (:meth:`offered`). None: unknown.
    facts: ModelFacts | None = None
    #: The choices each categorical param already has in the study: Optuna cannot change a
    #: categorical's choices within a study, so :meth:`offered` keeps them.
    study_choices: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    #: How a stage that times something (an export stage, its file) times it: the user's ``--latency-budget``
    #: (the runner's settings; the default budget in scripted use), on the timing service
    #: (:mod:`paretorch.pipeline.core.timing`).
    latency: LatencySettings = field(default_factory=default_latency)
    #: The batch sizes it times at (the runner's: a search's ``--latency-batch``); None: the spec's.
    latency_batch_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.device, str):  # scripted use: StageContext(spec, "cpu")
            self.device = torch.device(self.device)
        if isinstance(self.output_dir, str):
            self.output_dir = Path(self.output_dir)

    @property
    def capabilities(self) -> Capabilities:
        return capabilities(self.device)

    @cached_property
    def calibration_batches(self) -> list[Batch]:
        """The spec's calibration batches, on the device (loaded once)."""
        return [move_batch(batch, self.device) for batch in self.spec.calibration()]

    def timed_batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes a stage times latency at: :attr:`latency_batch_sizes`, else the spec's."""
        return tuple(self.latency_batch_sizes or self.spec.latency_batch_sizes)

    def example_inputs(self, batch_size: int = 2) -> Batch:
        return move_batch(self.spec.example_inputs(batch_size), self.device)

    def record(self, key: str, value: object) -> None:
        self.records[key] = value

    def resolve(self, config: StageConfig) -> None:
        self.resolved_config = config

    def offered(self, name: str, choices: Sequence[T], why_not: Callable[[T], str | None]) -> list[T]:
        """The choices of the categorical param ``name`` worth a trial on this model: those ``why_not``
        (the stage's ``rules_out`` of a config with that choice, read against :attr:`facts`) gives no
        reason against. Without facts, all of them; in a study that fixed the param's choices before,
        those (a ruled-out one is then answered before it runs, not run)."""
        if name in self.study_choices:
            return list(self.study_choices[name])
        if self.facts is None:
            return list(choices)
        return [choice for choice in choices if why_not(choice) is None]

    def upstream_config(self, config_type: type[C]) -> C | None:
        """The last upstream config of ``config_type``, if the recipe has one."""
        for config in reversed(self.upstream):
            if isinstance(config, config_type):
                return config
        return None

    def require_output_dir(self) -> Path:
        if self.output_dir is None:
            raise ConfigError("this stage writes files: give StageContext an output_dir")
        self.output_dir.mkdir(parents=True, exist_ok=True)
        return self.output_dir
