"""Shared pieces of the exporters: the model to convert, example inputs, output
comparison with a tolerance by kind, and converter errors as infeasible configs."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.evaluate import compute_metric
from paretorch.pipeline.core.fidelity import FIDELITY_METRIC_NAMES
from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.spec import Batch, ModelSpec
from paretorch.pipeline.core.stage import StageContext
from paretorch.pipeline.core.timing import measure_latency
from paretorch.stages.common.mirror_facts import PaddingFree

CPU = torch.device("cpu")
#: Exact exports (same float32 graph): max abs error <= this x max(1, max |reference|).
FLOAT32_ATOL = 1e-4
#: Lossy exports (int8 / 4-bit weights, float16 compute): cosine similarity floor. It catches a
#: broken conversion, not quantization error (the exporters measure that with the spec metric):
#: onnxruntime's dynamic int8 (per-tensor activations) gave cosine 0.991 on MiniLM.
LOSSY_MIN_COSINE = 0.95
#: Longest converter message quoted in an InfeasibleConfig reason.
MAX_REASON_CHARS = 300


def float_graph_on_cpu(model: nn.Module, ctx: StageContext) -> nn.Module:
    """A CPU copy, in eval mode, of the float graph to convert: ``ctx.float_model``
    (the model before quantize / amp) when set, else ``model``. Never the caller's object."""
    source = ctx.float_model if ctx.float_model is not None else model
    return copy.deepcopy(source).to(CPU).eval()


def cpu_inputs(spec: ModelSpec, batch_size: int) -> Batch:
    """The spec's example inputs at ``batch_size``, on the CPU."""
    return tuple(t.to(CPU) for t in spec.example_inputs(batch_size))


def file_measures(runner: Callable[..., Tensor], ctx: StageContext, prefix: str, metric: bool, latency: bool,
                  batch_sizes: Sequence[int]) -> dict[str, float]:
    """An exported file's own measurements, keyed ``<prefix>_...``: the spec metric over the evaluation split
    (``metric``) and latency p50 at each of ``batch_sizes`` with the context's budget (``latency``). A runtime that
    runs the file asks for neither: its trial evaluates and times that same file (an MPNet trial under ONNX Runtime
    spent 48 of its 150 s on the export's own evaluation pass)."""
    measures: dict[str, float] = {}
    if metric:
        measures[f"{prefix}_{ctx.spec.metric.name}"] = compute_metric(runner, ctx.spec.evaluation(), ctx.spec.metric,
                                                                      CPU)
    if latency:
        for batch_size in batch_sizes:
            stats = measure_latency(runner, cpu_inputs(ctx.spec, batch_size), CPU, ctx.latency)
            measures[f"{prefix}_latency_ms_p50_b{batch_size}"] = stats.p50_ms
    return measures


def flatten_outputs(outputs: object) -> list[Tensor]:
    """The tensors of a model output (a tensor, or nested tuples / lists / dicts), in order."""
    if isinstance(outputs, Tensor):
        return [outputs]
    if isinstance(outputs, Mapping):
        return [t for value in outputs.values() for t in flatten_outputs(value)]
    if isinstance(outputs, Sequence) and not isinstance(outputs, str):
        return [t for value in outputs for t in flatten_outputs(value)]
    return []


def run_reference(model: nn.Module, inputs: Batch) -> list[Tensor]:
    """The model's outputs on ``inputs`` as float32 CPU tensors."""
    with torch.no_grad():
        return [t.detach().to(CPU, torch.float32) for t in flatten_outputs(model(*inputs))]


@dataclass(frozen=True)
class OutputComparison:
    """How far an exported artifact's outputs are from the torch outputs (all outputs pooled)."""

    max_abs_error: float
    reference_max_abs: float
    cosine: float

    def within(self, lossy: bool) -> bool:
        """Float32 exports: max abs error within ``FLOAT32_ATOL`` (scaled); lossy: cosine floor."""
        if lossy:
            return self.cosine >= LOSSY_MIN_COSINE
        return self.max_abs_error <= FLOAT32_ATOL * max(1.0, self.reference_max_abs)

    def describe(self) -> str:
        return f"max abs err {self.max_abs_error:.2g}, cosine {self.cosine:.6f}"


def compare_outputs(reference: Sequence[Tensor], candidate: Sequence[Tensor]) -> OutputComparison:
    """Compare two output lists of the same structure; shape mismatches are infeasible."""
    if len(reference) != len(candidate):
        raise InfeasibleConfig(f"the export returns {len(candidate)} outputs, torch returns {len(reference)}")
    for index, (ref, got) in enumerate(zip(reference, candidate, strict=True)):
        if tuple(ref.shape) != tuple(got.shape):
            raise InfeasibleConfig(
                f"output {index} of the export has shape {tuple(got.shape)}, torch gives {tuple(ref.shape)}"
            )
    ref_flat = torch.cat([t.reshape(-1).to(torch.float64) for t in reference])
    got_flat = torch.cat([t.reshape(-1).to(torch.float64) for t in candidate])
    cosine = torch.nn.functional.cosine_similarity(ref_flat, got_flat, dim=0, eps=1e-12)
    return OutputComparison(
        max_abs_error=float((ref_flat - got_flat).abs().max()) if ref_flat.numel() else 0.0,
        reference_max_abs=float(ref_flat.abs().max()) if ref_flat.numel() else 0.0,
        cosine=float(cosine) if ref_flat.numel() else 1.0,
    )


def judged_by_labels(spec: ModelSpec) -> bool:
    """Whether ``spec``'s metric reads labels (``--eval-data``, a built-in task), not fidelity to the unoptimized
    model: then the labelled metric and the allowed drop judge a lossy export, not a fixed cosine."""
    return spec.metric.name not in FIDELITY_METRIC_NAMES


def require_close(comparison: OutputComparison, lossy: bool, what: str, spec: ModelSpec | None = None) -> str:
    """Raise :class:`InfeasibleConfig` when ``comparison`` is outside the tolerance of its kind; the validation note
    otherwise. A lossy export of a ``spec`` judged by labels (:func:`judged_by_labels`) is never ruled out by the
    cosine floor: its note says it lies below it, and the trial's labelled metric decides."""
    if comparison.within(lossy):
        return f"{what} matches torch: {comparison.describe()}"
    bound = f"cosine >= {LOSSY_MIN_COSINE}" if lossy else f"max abs err <= {FLOAT32_ATOL:g} x max(1, |ref|)"
    if lossy and spec is not None and judged_by_labels(spec):
        return (f"{what} is below the lossy export's cosine floor ({comparison.describe()}; {bound}): not ruled out, "
                f"the labelled metric ({spec.metric.name}) and the allowed drop judge it")
    raise InfeasibleConfig(f"{what} differs from torch beyond tolerance ({comparison.describe()}; needs {bound})")


def short_error(exc: BaseException) -> str:
    """``Type: first line of the message``, cut to ``MAX_REASON_CHARS``."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else '(no message)'}"
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def converter_failure(what: str, exc: BaseException) -> InfeasibleConfig:
    """An :class:`InfeasibleConfig` that quotes a converter's error briefly."""
    return InfeasibleConfig(f"{what} failed: {short_error(exc)}")


def grouped_mask_input(upstream: ExportMirror, spec: ModelSpec) -> int | None:
    """A pack recipe's file (the padded graph) is called once per length group of rows: the padding-mask input
    the groups are cut by (:attr:`ExportResult.grouped_mask_input`); None for any other recipe."""
    return spec.padding_mask if upstream.of(PaddingFree) is not None else None


def grouped_note(mask_input: int | None) -> list[str]:
    """The validation note of a file a runtime calls per length group (none for one called as it is)."""
    if mask_input is None:
        return []
    return [f"pack: the padded graph (a whole batch computes every padding token; the onnxruntime and openvino "
            f"runtimes call it once per group of similar-length rows, by the padding mask, input {mask_input})"]
