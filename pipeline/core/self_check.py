"""Can the metric tell the unoptimized model from itself? Score it again, twice and re-batched, before a search.

A model that keeps state between calls (a streaming voice-activity detector, a running
normalizer) or draws random numbers in eval mode scores differently each time it is
scored: its metric then measures the call history, not the optimization, and a search
would put unchanged copies on the Pareto front. :func:`self_check` takes the model's first scoring (the study's
one reference pass over the evaluation data, or one pass here), then re-scores a leading subset of
:data:`SUBSET_SAMPLES` samples three ways: at the evaluation's own batching, again at it (a move between those
two is state or randomness), and re-cut at another batch size (a move there only is a batch-size dependence).
It compares the metric (always over the whole set, those rows taken from the pass: a pairs or retrieval metric
names rows by index) and, on the CPU, the raw outputs; :func:`require_stable` turns a moving
metric into a :class:`SpecError` unless the user allows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from typing import TextIO

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.device import move_module
from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.evaluate import evaluation_outputs
from paretorch.pipeline.core.names import ALLOW_FLAG
from paretorch.pipeline.core.progress import phase
from paretorch.pipeline.core.spec import LabelledBatch, ModelSpec

#: On the CPU, float32 outputs of the passes must agree within these (same kernels, any batch size).
CPU_RTOL, CPU_ATOL = 1e-4, 1e-5
#: The metric may move by this times max(1, |metric|): on the CPU (ties), on accelerators (nondeterministic kernels).
CPU_METRIC_TOLERANCE, ACCELERATOR_METRIC_TOLERANCE = 1e-4, 1e-3
#: The leading evaluation batches re-scored hold at least this many samples (all of them, for a smaller set).
SUBSET_SAMPLES = 256
#: Why a model's scores move, by the pass where they moved (the error line says what to fix).
STATE_CAUSE = "it keeps state between calls or is nondeterministic"
BATCH_CAUSE = "its outputs depend on the batch size (padding or batch statistics in eval mode)"


@dataclass(frozen=True)
class SelfCheck:
    """The spec's metric on the unoptimized model's re-scored subset: first scored, twice again and re-batched."""

    metric: str
    first: float
    second: float
    rebatched: float
    batch_size: int
    rebatch_size: int
    #: Largest absolute difference between the first pass's outputs and another pass's.
    output_change: float
    #: What moved and why (a phrase for the error line), or "" when the model is stable.
    moved: str
    seconds: float
    #: The samples re-scored (0: a check stored before subsets, which re-scored every sample).
    samples: int = 0

    @property
    def stable(self) -> bool:
        return not self.moved

    @property
    def spread(self) -> float:
        """How far the metric moved between the passes."""
        values = (self.first, self.second, self.rebatched)
        return max(values) - min(values)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def summary(self) -> str:
        """One line: what was compared, the result and the cost."""
        if self.stable:
            return (f"self-check: {self.metric} {self.first:.6g} on {self.samples} samples scored again twice and at "
                    f"batch {self.rebatch_size}, stable (largest output change {self.output_change:.1g}; "
                    f"{self.seconds:.1f} s)")
        return (f"warning: the baseline is unstable ({ALLOW_FLAG}): {self.metric} {self.first:.6g}, then "
                f"{self.second:.6g}, then {self.rebatched:.6g} at batch {self.rebatch_size} (moves by up to "
                f"{self.spread:.3g}; outputs by up to {self.output_change:.3g}): "
                "metric differences below that are noise")


def reference_outputs(model: nn.Module, spec: ModelSpec, device: torch.device) -> tuple[Tensor, Tensor]:
    """``model``'s outputs (eager, eval mode; the unoptimized model) and the targets over ``spec.evaluation()`` at
    its own batching: what :func:`self_check` and the baseline's evaluation
    (:func:`paretorch.pipeline.core.evaluate.evaluate_model`) both read. Shared with the spec's other readers
    (``ModelSpec.unoptimized``): on the CPU, batches they already ran are read, not run, once ``model`` gives their
    outputs on the first batch (a spec whose ``build`` makes another model each call is run here); batches run here
    are given to them. (On an accelerator the study's reference is its own device's outputs.)"""
    batches = spec.evaluation()
    inputs = [batch for batch, _ in batches]
    shared = spec.unoptimized_outputs
    if device.type == "cpu" and shared.has(inputs) and _gives_the_same(model, inputs[0], shared.of(inputs[:1])):
        return shared.of(inputs), torch.cat([target for _, target in batches])
    rows = sum(int(target.shape[0]) for _, target in batches)
    with phase(f"reference: the unoptimized model over the evaluation set ({rows} rows, {len(batches)} batches)"):
        outputs, targets = evaluation_outputs(move_module(model, device).eval(), batches, device)
    for batch, rows in zip(inputs, outputs.split([int(target.shape[0]) for _, target in batches]), strict=True):
        shared.provide(batch, rows)
    return outputs, targets


def _gives_the_same(model: nn.Module, batch: tuple[Tensor, ...], known: Tensor) -> bool:
    """Whether ``model`` (on the CPU) gives ``known`` on ``batch``, within the CPU tolerance of the passes."""
    with torch.inference_mode():
        output = move_module(model, torch.device("cpu")).eval()(*batch)
    return isinstance(output, Tensor) and _close(output.detach().float(), known)


def lazy_reference(model: nn.Module, spec: ModelSpec, device: torch.device) -> Callable[[], tuple[Tensor, Tensor]]:
    """:func:`reference_outputs`, computed on the first call and kept: a search's self-check and its baseline's
    evaluation both read them, so a study runs the unoptimized model over its data once for both."""
    return cache(lambda: reference_outputs(model, spec, device))


def self_check(model: nn.Module, spec: ModelSpec, device: torch.device, stream: TextIO | None = None,
               reference: tuple[Tensor, Tensor] | None = None) -> SelfCheck:
    """Score ``model`` (moved to ``device``, eval mode, eager) with ``spec.metric`` as the module docstring says.
    ``stream``: where its progress lines go (default: standard output; ``evaluate --json`` keeps them off the JSON).
    ``reference``: the model's outputs and targets at the evaluation's own batching, computed once per study (the
    baseline's evaluation reads the same): the first scoring is read from them, so the model runs here over the
    subset alone (three times :data:`SUBSET_SAMPLES` samples at most), not over the whole set."""
    start = time.perf_counter()
    model = move_module(model, device).eval()
    batches = spec.evaluation()
    batch_size = int(batches[0][1].shape[0])
    rebatch_size = batch_size // 2 if batch_size > 1 else 2
    subset = leading_batches(batches, SUBSET_SAMPLES)
    samples = sum(int(target.shape[0]) for _, target in subset)
    if reference is None:
        reference = evaluation_outputs(model, batches, device)
    known_outputs, known_targets = reference
    # The metric is always read over the whole set, the subset's rows taken from the pass: a metric of the set (pairs
    # or retrieval rows named by their index, a rank correlation) cannot be scored on a subset alone.
    first = float(spec.metric.compute(known_outputs, known_targets).item())
    passes: list[tuple[float, Tensor]] = [(first, known_outputs.float()[:samples])]
    sizes = (None, None, rebatch_size)
    # A long step says so when it starts (a large model's passes take minutes on a loaded CPU).
    with phase(f"self-check: scoring {spec.name} again on {samples} samples, twice and at batch {rebatch_size}",
               total=len(sizes), stream=stream) as shown:
        for size in sizes:
            outputs, _ = evaluation_outputs(model, subset, device, size, spec.padding_mask)
            spliced = torch.cat([outputs.to(known_outputs.device, known_outputs.dtype), known_outputs[samples:]])
            passes.append((float(spec.metric.compute(spliced, known_targets).item()), outputs.float()))
            shown.advance()
    (_, first_outputs), *others = passes
    changes = [_largest_change(first_outputs, later) for _, later in others]
    tolerance = (CPU_METRIC_TOLERANCE if device.type == "cpu" else ACCELERATOR_METRIC_TOLERANCE) * max(1.0, abs(first))
    again = "when the same inputs were scored again in the same batches"
    hows = ((again, STATE_CAUSE), (again, STATE_CAUSE),
            (f"when the same inputs were scored in batches of {rebatch_size} instead of {batch_size}", BATCH_CAUSE))
    moved = ""
    for (value, later), change, (how, cause) in zip(others, changes, hows, strict=True):
        if abs(value - first) > tolerance:
            moved = f"its {spec.metric.name} moved from {first:.6g} to {value:.6g} {how}: {cause}"
        elif device.type == "cpu" and not _close(first_outputs, later):
            moved = (f"its outputs moved by up to {change:.3g} {how} ({spec.metric.name} {first:.6g} -> {value:.6g}): "
                     f"{cause}")
        if moved:
            break
    return SelfCheck(spec.metric.name, first, others[1][0], others[2][0], batch_size, rebatch_size,
                     max(changes), moved, time.perf_counter() - start, samples)


def leading_batches(batches: Sequence[LabelledBatch], samples: int) -> list[LabelledBatch]:
    """The first of ``batches`` that hold at least ``samples`` samples between them (all, if they hold fewer)."""
    taken: list[LabelledBatch] = []
    count = 0
    for batch in batches:
        if count >= samples:
            break
        taken.append(batch)
        count += int(batch[1].shape[0])
    return taken


def _largest_change(a: Tensor, b: Tensor) -> float:
    return float((a - b).abs().max().item()) if a.shape == b.shape else float("inf")


def _close(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=CPU_RTOL, atol=CPU_ATOL, equal_nan=True)


def require_stable(check: SelfCheck, model_name: str, allow: bool, action: str = "search") -> str:
    """The line to print about ``check``; raises :class:`SpecError` if the metric moved and ``allow`` is False."""
    if not check.stable and not allow:
        raise SpecError(f"model '{model_name}': {check.moved}; fix the model (reset its state in forward, eval "
                        f"mode, a fixed seed) or pass {ALLOW_FLAG} to {action} anyway")
    return check.summary()
