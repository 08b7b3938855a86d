"""Measure a model: task metric, latency per batch size (timed alone on the timing service, pipeline/core/timing.py,
with the budget of pipeline/core/latency.py), memory, size, params, MACs."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from paretorch.pipeline.core.device import describe, move_module, peak_memory_bytes, reset_peak_memory
from paretorch.pipeline.core.input_agreement import Reference
from paretorch.pipeline.core.latency import LatencySettings, LatencyStats, default_latency
from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.padding import LatencyInputs, pad_to, to_bucket, trim_to_longest
from paretorch.pipeline.core.padding import latency_inputs as choose_latency_inputs
from paretorch.pipeline.core.runtimes.registry import get_runtime, prepare_runtime
from paretorch.pipeline.core.spec import Batch, LabelledBatch, Metric, ModelSpec, move_batch
from paretorch.pipeline.core.timing import measure_latency

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelReport:
    """All measurements of one model on one device and runtime."""

    metric_name: str
    metric_value: float
    latency: dict[int, LatencyStats]
    peak_memory_bytes: int
    size_bytes: int
    params: int
    macs: int | None  # None: torch's flop counter could not run this model (see count_macs)
    runtime: str
    compile_seconds: float
    device: str
    extra: dict[str, float] = field(default_factory=dict)
    #: Sequence specs: the lengths each latency batch was measured at, and the bucket's measured cost.
    latency_inputs: dict[int, LatencyInputs] = field(default_factory=dict)
    #: The metric on each fixed bootstrap resample of the evaluation units (:mod:`paretorch.pipeline.core.bootstrap`;
    #: empty when the metric has none): paired with the baseline's, the interval of a trial's drop.
    metric_resamples: tuple[float, ...] = ()
    #: The inputs that agree least with the unoptimized model, worst first (:meth:`InputAgreement.worst`; empty
    #: when no reference was given): index, value, text where known.
    worst_inputs: tuple[dict[str, object], ...] = ()

    def latency_p50(self, batch_size: int | None = None) -> float:
        """Median latency in ms at ``batch_size`` (default: the first measured)."""
        key = batch_size if batch_size is not None else next(iter(self.latency))
        return self.latency[key].p50_ms

    def as_metrics(self) -> dict[str, float]:
        """Flat name -> number mapping, as logged to MLflow."""
        metrics: dict[str, float] = {
            self.metric_name: self.metric_value,
            "peak_memory_bytes": float(self.peak_memory_bytes),
            "size_bytes": float(self.size_bytes),
            "params": float(self.params),
            "compile_seconds": self.compile_seconds,
        }
        if self.macs is not None:
            metrics["macs"] = float(self.macs)
        for batch, stats in self.latency.items():
            metrics[f"latency_ms_p50_b{batch}"] = stats.p50_ms
            metrics[f"latency_ms_p90_b{batch}"] = stats.p90_ms
            metrics[f"latency_ms_p50_b{batch}_ci_low"] = stats.p50_ci_low_ms
            metrics[f"latency_ms_p50_b{batch}_ci_high"] = stats.p50_ci_high_ms
        for batch, lengths in self.latency_inputs.items():
            metrics[f"latency_tokens_b{batch}"] = float(lengths.measured_length)
            metrics[f"latency_longest_tokens_b{batch}"] = float(lengths.length)
            overhead = lengths.bucket_overhead_pct(self.latency[batch].p50_ms) if batch in self.latency else None
            if lengths.trimmed_p50_ms is not None and overhead is not None:
                metrics[f"latency_ms_p50_b{batch}_unbucketed"] = lengths.trimmed_p50_ms
                metrics[f"bucket_overhead_pct_b{batch}"] = overhead
        metrics.update(self.extra)
        return metrics

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["latency"] = {str(k): asdict(v) for k, v in self.latency.items()}
        data["latency_inputs"] = {str(k): asdict(v) for k, v in self.latency_inputs.items()}
        return data


# --------------------------------------------------------------------------- pieces


def fixed_size_chunks(batches: Sequence[LabelledBatch], batch_size: int,
                      padding_mask: int | None = None) -> list[tuple[Batch, int]]:
    """The evaluation inputs re-cut into chunks of exactly ``batch_size`` rows, each with its
    count of real rows; the last chunk is padded with copies of its last row. A compiled
    runtime then reuses the shape it compiled for latency instead of compiling new ones.
    ``padding_mask`` (a sequence spec's mask input): every chunk is cut to one length, the
    smallest length bucket that fits the longest sample (one compiled shape, as latency's)."""
    parts = [batch_inputs for batch_inputs, _ in batches]
    if padding_mask is not None:  # batches padded to different lengths (e.g. a fidelity floor's own rows)
        width = max(int(batch[padding_mask].shape[1]) for batch in parts)
        parts = [pad_to(batch, width, padding_mask) for batch in parts]
    inputs = tuple(torch.cat(tensors) for tensors in zip(*parts, strict=True))
    if padding_mask is not None:
        inputs = to_bucket(inputs, padding_mask)
    chunks: list[tuple[Batch, int]] = []
    for start in range(0, inputs[0].shape[0], batch_size):
        chunk = tuple(t[start : start + batch_size] for t in inputs)
        real = chunk[0].shape[0]
        if real < batch_size:
            chunk = tuple(torch.cat([t, t[-1:].expand(batch_size - real, *t.shape[1:])]) for t in chunk)
        chunks.append((chunk, real))
    return chunks


def compute_metrics(
    fn: Callable[..., Tensor],
    batches: Sequence[LabelledBatch],
    metrics: Sequence[Metric],
    device: torch.device,
    batch_size: int | None = None,
    padding_mask: int | None = None,
) -> dict[str, float]:
    """Run ``fn`` once over the evaluation batches and compute every metric on the device.

    ``batch_size``: feed the inputs in chunks of this size, with ``padding_mask`` in one length
    bucket (see :func:`fixed_size_chunks`); the metric is unchanged. Outputs and targets stay on
    the device; the only host reads are the final values.
    """
    outputs, targets = evaluation_outputs(fn, batches, device, batch_size, padding_mask)
    values = [metric.compute(outputs, targets) for metric in metrics]
    return {metric.name: float(value.item()) for metric, value in zip(metrics, values, strict=True)}


def scoring_chunks(spec: ModelSpec, runtime: str, batch_sizes: Sequence[int]) -> tuple[int | None, int | None]:
    """How :func:`evaluate_model` feeds the evaluation to ``runtime`` (``batch_size`` and ``padding_mask`` of
    :func:`compute_metrics`): a compiled runtime in fixed-size chunks of the largest of ``batch_sizes`` (the
    measured latency batch sizes: no extra compilation), cut to one width (a bucket: one shape for a
    static-shape runtime, one more length for a dynamic one); any other runtime per evaluation batch."""
    if not get_runtime(runtime).compiles:
        return None, None
    return max(batch_sizes), spec.padding_mask


def task_metric(fn: Callable[..., Tensor], spec: ModelSpec, device: torch.device, runtime: str,
                batch_sizes: Sequence[int]) -> float:
    """The spec's task metric on ``fn`` (a model prepared for ``runtime``) as :func:`evaluate_model` scores it
    (:func:`scoring_chunks`): the benchmarks' held-out checks and replayed recipes."""
    chunk, mask = scoring_chunks(spec, runtime, batch_sizes)
    return compute_metrics(fn, spec.evaluation(), (spec.metric,), device, chunk, mask)[spec.metric.name]


def evaluation_outputs(fn: Callable[..., Tensor], batches: Sequence[LabelledBatch], device: torch.device,
                       batch_size: int | None = None, padding_mask: int | None = None) -> tuple[Tensor, Tensor]:
    """``fn``'s outputs over the evaluation batches and their targets, both concatenated on the device
    (``batch_size``, ``padding_mask``: as :func:`compute_metrics`)."""
    chunks = (
        fixed_size_chunks(batches, batch_size, padding_mask)
        if batch_size is not None
        else [(inputs, int(target.shape[0])) for inputs, target in batches]
    )
    outputs: list[Tensor] = []
    with torch.no_grad():
        for inputs, real in chunks:
            # clone: a CUDA-graph runtime reuses its output buffer on the next call
            outputs.append(fn(*move_batch(inputs, device)).float()[:real].clone())
    return torch.cat(outputs), torch.cat([target for _, target in batches]).to(device)


def metric_resamples(metric: Metric, outputs: Tensor, targets: Tensor) -> tuple[float, ...]:
    """``metric`` on each bootstrap resample of the evaluation units, read back once (empty: none)."""
    if metric.resampled is None:
        return ()
    return tuple(float(v) for v in metric.resampled(outputs, targets).tolist())


def compute_metric(
    fn: Callable[..., Tensor], batches: Sequence[LabelledBatch], metric: Metric, device: torch.device
) -> float:
    """Run ``fn`` over the evaluation batches and compute one metric on the device."""
    return compute_metrics(fn, batches, (metric,), device)[metric.name]


#: torch.save stores the file's stem inside the archive, so the size depends on the name.
STATE_DICT_FILENAME = "model.pt"


def serialized_size_bytes(model: nn.Module) -> int:
    """Bytes of ``torch.save(model.state_dict(), "model.pt")`` (what a user would ship)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / STATE_DICT_FILENAME
        torch.save(model.state_dict(), path)
        return path.stat().st_size


#: Buffer dtypes that hold quantized weights (scales are float, zero points int32/int64: not counted).
QUANTIZED_WEIGHT_DTYPES = (torch.int8, torch.uint8)
#: Name prefix of weights that freezing / constant folding turned into buffers (PT2E int8).
FROZEN_PARAM_PREFIX = "_frozen_param"


def count_params(model: nn.Module) -> int:
    """Number of weight elements, the same for a network in float and quantized: parameters (torchao's
    quantized tensor subclasses report their logical shape), plus weights that quantization moved
    into buffers (PT2E stores int8 weights as ``_frozen_param*`` buffers); quantization scales and
    zero points and BatchNorm statistics are not counted. A graph without parameters or buffers
    (e.g. TorchScript constants) counts all its state tensors."""
    params = sum(p.numel() for p in model.parameters())
    params += sum(b.numel() for name, b in model.named_buffers()
                  if b.dtype in QUANTIZED_WEIGHT_DTYPES or name.rsplit(".", 1)[-1].startswith(FROZEN_PARAM_PREFIX))
    if params:
        return params
    return sum(t.numel() for t in model.state_dict().values() if isinstance(t, Tensor))


def _matmul_flops(a_shape: Sequence[int], b_shape: Sequence[int], *args: object, **kwargs: object) -> int:
    """FLOPs of an (m, k) @ (k, n) matmul (the flop counter's formula for ``aten.mm``)."""
    (m, k), (_, n) = a_shape, b_shape
    return 2 * m * n * k


def count_macs(model: nn.Module, inputs: Batch) -> int | None:
    """Multiply-accumulates of one forward on ``inputs`` (FLOPs / 2, torch's flop counter).

    None, with a logged warning, when the counter cannot run the model: the counter is a
    dispatch mode, and some operators do not pass through one (torch 2.11's ``out_dtype``,
    which torchao's int8 matmul uses on CUDA, returns NotImplemented under it). The
    model's own forward has already run by then, so only the count is lost."""
    # int8 matmuls (torchao int8_dynamic on CPU) count as the float matmul they replace.
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten._int_mm: _matmul_flops})
    try:
        with torch.no_grad(), counter:
            model(*inputs)
    except Exception as exc:  # the counter's failure, not the model's: reported, MACs left unknown
        logger.warning("MACs not counted: torch's flop counter cannot run this model (%s: %s)", type(exc).__name__, exc)
        return None
    return int(counter.get_total_flops() // 2)


# --------------------------------------------------------------------------- whole model


@dataclass(frozen=True)
class Known:
    """What a caller already has for an evaluation, not measured again: the model prepared for its runtime
    (``fn``), its latency per batch size (``latency``: a search trial's paired rounds, one number per fact; the
    bucket's own cost is then not measured either), its evaluation outputs and targets (``outputs``: computed the
    way an eager evaluation would, at the evaluation's own batching: the unoptimized model's,
    :func:`paretorch.pipeline.core.self_check.reference_outputs`), and the unoptimized model's outputs to compare with
    input by input (``reference``: :mod:`paretorch.pipeline.core.input_agreement`; None: no per-input view)."""

    fn: Callable[..., Tensor] | None = None
    latency: Mapping[int, LatencyStats] = field(default_factory=dict)
    outputs: tuple[Tensor, Tensor] | None = None
    reference: Reference | None = None


def _latencies(fn: Callable[..., Tensor], spec: ModelSpec, device: torch.device, runtime: str,
               settings: LatencySettings, batch_sizes: Sequence[int],
               known: Known) -> tuple[dict[int, LatencyStats], dict[int, LatencyInputs], float]:
    """Latency per batch size (measured unless ``known``), the sequence lengths each was timed at, and the
    milliseconds a compiled runtime spent compiling."""
    compiled = get_runtime(runtime).compiles
    compile_ms = 0.0
    latency: dict[int, LatencyStats] = {}
    lengths: dict[int, LatencyInputs] = {}
    for batch_size in batch_sizes:
        # A sequence spec's batch is cut to its longest sample, or to a length bucket (static shapes).
        cpu_inputs, batch_lengths = choose_latency_inputs(spec, batch_size, runtime)
        given = known.latency.get(batch_size)
        stats = measure_latency(fn, move_batch(cpu_inputs, device), device, settings) if given is None else given
        latency[batch_size] = stats
        if compiled:
            compile_ms += max(0.0, stats.first_call_ms - stats.p50_ms)
        if batch_lengths is not None and spec.padding_mask is not None:
            if batch_lengths.measured_length != batch_lengths.length and given is None:
                # What the bucket costs, measured: the same batch at its own length.
                own = measure_latency(fn, move_batch(trim_to_longest(cpu_inputs, spec.padding_mask), device),
                                      device, settings)
                compile_ms += max(0.0, own.first_call_ms - own.p50_ms)
                batch_lengths = dataclasses.replace(batch_lengths, trimmed_p50_ms=own.p50_ms)
            lengths[batch_size] = batch_lengths
    return latency, lengths, compile_ms


def evaluate_model(
    model: nn.Module,
    spec: ModelSpec,
    device: torch.device,
    runtime: str = DEFAULT_RUNTIME,
    settings: LatencySettings = default_latency(),
    batch_sizes: Sequence[int] | None = None,
    fn: Callable[..., Tensor] | None = None,
    known: Known = Known(),
) -> ModelReport:
    """Measure ``model`` (not modified; moved to ``device``) under ``runtime``; ``fn``: the model
    already prepared for ``runtime`` (on ``device``), else prepared here; ``known``: what is not measured again."""
    model = move_module(model, device).eval()
    fn = fn or known.fn or prepare_runtime(model, runtime, device)
    reset_peak_memory(device)
    latency, lengths, compile_ms = _latencies(fn, spec, device, runtime, settings,
                                              batch_sizes or spec.latency_batch_sizes, known)
    peak = peak_memory_bytes(device)
    # A compiled runtime evaluates at the largest measured batch size, in one length bucket.
    metric_batch, bucketed = scoring_chunks(spec, runtime, tuple(latency))
    computed = known.outputs if known.outputs is not None and metric_batch is None else None
    outputs, targets = computed or evaluation_outputs(fn, spec.evaluation(), device, metric_batch, bucketed)
    values = {metric.name: float(metric.compute(outputs, targets).item())
              for metric in (spec.metric, *spec.extra_metrics)}
    metric_value = values.pop(spec.metric.name)
    worst: tuple[dict[str, object], ...] = ()
    if known.reference is not None:
        agreement = known.reference.compare(outputs)
        values.update(agreement.metrics())
        worst = tuple(agreement.worst(texts=spec.evaluation_texts))
    macs = count_macs(model, move_batch(choose_latency_inputs(spec, 1, DEFAULT_RUNTIME)[0], device))
    return ModelReport(
        metric_name=spec.metric.name,
        metric_value=metric_value,
        latency=latency,
        peak_memory_bytes=peak,
        size_bytes=serialized_size_bytes(model),
        params=count_params(model),
        macs=macs,
        runtime=runtime,
        compile_seconds=compile_ms / 1000.0,
        device=describe(device),
        extra=values,
        latency_inputs=lengths,
        metric_resamples=metric_resamples(spec.metric, outputs, targets),
        worst_inputs=worst,
    )
