"""BENCHMARKS.md sections for the row benchmarks that are not searches: the accelerator rows
(``gpu-rows-*.json``, :mod:`paretorch.experiments.bench.gpu_rows`), MLX on the lent GPU (``mlx-cuda-*.json``, measured
with ``mlx-cuda-13`` on the device machine) and the compile-shape comparison (``compile-shapes-*.json``,
:mod:`paretorch.experiments.bench.compile_shapes`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # the files' shapes alone (their modules import torch.compile's internals and the stages)
    from paretorch.experiments.bench.compile_shapes import CompileShapesReport, Ratio
    from paretorch.experiments.bench.gpu_rows import GpuRowsResult

GPU_ROWS_PREFIX = "gpu-rows-"
COMPILE_SHAPES_PREFIX = "compile-shapes-"
MLX_CUDA_PREFIX = "mlx-cuda-"


class MlxCudaRow(TypedDict):
    """A model at a batch: torch eager's ms, MLX's (torch tensors in and out; MLX arrays), and their output parity."""

    model: str
    batch: int
    torch_eager_cuda_ms: float
    mlx_cuda_from_torch_ms: float
    mlx_cuda_arrays_ms: float
    max_abs_err: float
    cosine: float


class MlxCudaResult(TypedDict):
    device: str
    date: str
    what: str
    rows: list[MlxCudaRow]


def render_mlx_cuda(result: MlxCudaResult) -> str:
    """MLX's CUDA build against torch eager on the same GPU, per model and batch, with output parity."""
    lines = [f"### MLX on {result['device']} ({result['date']})", "", result["what"], "",
             "| model | batch | torch eager CUDA ms | MLX, torch tensors in and out, ms | MLX arrays on the GPU, ms "
             "| max abs error | cosine |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        lines.append(f"| {row['model']} | {row['batch']} | {row['torch_eager_cuda_ms']:.3f} | "
                     f"{row['mlx_cuda_from_torch_ms']:.3f} | {row['mlx_cuda_arrays_ms']:.3f} | "
                     f"{row['max_abs_err']:.1e} | {row['cosine']:.6f} |")
    return "\n".join(lines)


def render_gpu_rows(result: GpuRowsResult) -> str:
    """One table: every row paired with fp32 eager, its task metric, held-out score and achieved TFLOP/s."""
    lines = [f"### MiniLM rows on {result['device']} (torch {result['torch']}, {result.get('date', 'undated')}): "
             "the one-line cast beside the stages",
             "",
             "Each row timed in alternating rounds with fp32 eager on the spec's fixed latency batch (padded to its "
             "longest sentence); speed-up = median of per-round ratios [95% CI]. TFLOP/s: padded work / on real "
             "tokens only. Metric: word similarity (Spearman x 100); held-out: STS dev pairs (Spearman x 100).",
             "",
             "| batch | tokens | real | runtime | row | speed-up [95% CI] | metric | held-out "
             "| TFLOP/s padded / real |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        held = f"{row['held_out']:.2f}" if "held_out" in row else "-"
        low, high = row["ci"]
        tokens = " x ".join(map(str, row["tokens"]))
        flops = f"{row['tflops_padded'] or 0:.0f} / {row['tflops_real'] or 0:.0f}"
        lines.append(f"| {row['batch']} | {tokens} | {row['real_token_fraction']:.0%} | {row['runtime']} | "
                     f"{row['row']} | {row['speedup']:.2f}x [{low:.2f}, {high:.2f}] | {row['metric']:.2f} | {held} | "
                     f"{flops} |")
    return "\n".join(lines)


def render_compile_shapes(result: CompileShapesReport) -> str:
    """Per dtype and input set: dynamic sequence length against length buckets and the exact length."""
    lines = [f"### torch.compile shapes on MiniLM (CPU, {result['threads']} thread(s), cores {result['affinity']}, "
             f"torch {result['torch']}; load {result['load_before']} -> {result['load_after']})", "",
             "| dtype | inputs | length / bucket | bucket / dynamic | dynamic / exact | eager / dynamic |",
             "| --- | --- | --- | --- | --- | --- |"]
    for dtype, parts in result["dtypes"].items():
        for name, inputs in parts["sets"].items():
            ratios = inputs["ratios"]

            def cell(key: str, ratios: dict[str, Ratio] = ratios) -> str:
                r = ratios[key]
                return f"{r['median']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"

            lines.append(f"| {dtype} | {name} | {inputs['length']} / {inputs['bucket']} | "
                         f"{cell('static_bucket / dynamic')} | {cell('dynamic / static_exact')} | "
                         f"{cell('eager / dynamic')} |")
    return "\n".join(lines)
