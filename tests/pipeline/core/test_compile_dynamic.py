"""``compile_dynamic``: one compiled graph runs a sequence model at every length, with the outputs of the
bucketed ``compile``; the evaluator times it at the batch's own length and keeps the bucket cost for
static-shape runtimes; a model that fixes its length is infeasible with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch._dynamo.utils import counters

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.evaluate import LatencySettings, evaluate_model
from paretorch.pipeline.core.padding import to_bucket, trim_to_longest
from paretorch.pipeline.core.runtimes import compile_dynamic
from paretorch.pipeline.core.runtimes.compile import COMPILE
from paretorch.pipeline.core.runtimes.compile_dynamic import COMPILE_DYNAMIC, sequence_dynamic
from paretorch.pipeline.core.runtimes.registry import get_runtime, prepare_runtime
from paretorch.pipeline.core.spec import Batch, Metric, ModelSpec
from paretorch.pipeline.search.config import SearchConfig
from paretorch.pipeline.sources.huggingface import PooledEmbedding

CPU = torch.device("cpu")
QUICK = LatencySettings(warmup_runs=1, min_runs=2, min_seconds=0.0)
OUTPUT_SUM = Metric("output_sum", higher_is_better=True, compute=lambda outputs, _targets: outputs.sum())
WIDTH = 64
#: Batches' longest samples 9, 40, 14, 22 (buckets 16, 64, 16, 32): four lengths, three buckets.
LENGTHS = [[9, 3], [40, 7], [14, 2], [22, 11]]


def right_padded(lengths: list[int], seed: int = 0) -> Batch:
    """(input_ids, attention_mask) right-padded to WIDTH; id 0 is padding."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 500, (len(lengths), WIDTH), generator=generator)
    mask = (torch.arange(WIDTH) < torch.tensor(lengths).unsqueeze(1)).long()
    return ids * mask, mask


class TinyBert(nn.Module):
    """A 2-layer HF BertModel from a local config with masked mean pooling (no download)."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        config = BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=WIDTH)
        self.inner = PooledEmbedding(BertModel(config), pooling="mean", normalize=True).eval()

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.inner(input_ids, attention_mask)


@pytest.fixture(scope="module")
def encoder() -> nn.Module:
    return TinyBert().eval()


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def test_one_dynamic_graph_runs_every_length_with_the_bucketed_outputs(encoder: nn.Module) -> None:
    torch.compiler.reset()
    dynamic = prepare_runtime(encoder, "compile_dynamic", CPU)
    static = prepare_runtime(encoder, "compile", CPU)
    padded = [right_padded(lengths) for lengths in LENGTHS]
    batches = [trim_to_longest(batch, 1) for batch in padded]
    buckets = [to_bucket(batch, 1) for batch in padded]
    assert [b[1].shape[1] for b in batches] == [9, 40, 14, 22] and [b[1].shape[1] for b in buckets] == [16, 64, 16, 32]
    before = graphs()
    with torch.no_grad():
        own = [dynamic(*batch) for batch in batches]
        dynamic_graphs = graphs() - before
        bucketed = [static(*batch) for batch in buckets]
        static_graphs = graphs() - before - dynamic_graphs
        eager = [encoder(*batch) for batch in batches]
    assert dynamic_graphs == 1, "the dynamic runtime compiled a graph per length"
    assert static_graphs == 3, "one static graph per bucket (16, 64, 32)"
    for got, bucket, reference in zip(own, bucketed, eager, strict=True):
        torch.testing.assert_close(got, bucket, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)


def test_the_callers_tensors_carry_no_dynamic_mark() -> None:
    ids, mask = right_padded([5, 9])
    scale = torch.ones(2, 3)
    marked = sequence_dynamic((ids, mask, scale))
    assert not hasattr(ids, "_dynamo_dynamic_indices") and not hasattr(mask, "_dynamo_dynamic_indices")
    assert marked[0]._dynamo_dynamic_indices == {1} and marked[0].data_ptr() == ids.data_ptr()  # type: ignore[attr-defined]
    assert marked[2] is scale, "a float input is not a token input: left as it is"


class FixedLength(nn.Module):
    """Adds a 20-wide table along the sequence: only length 20 runs (its code fixes the length)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(500, 4)
        self.position = nn.Parameter(torch.randn(20, 4))

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return ((self.embed(input_ids) + self.position) * attention_mask.unsqueeze(-1)).sum(dim=1)


def test_a_model_that_fixes_its_length_is_infeasible_with_the_reason() -> None:
    torch.compiler.reset()
    fn = prepare_runtime(FixedLength().eval(), "compile_dynamic", CPU)
    ids, mask = right_padded([20, 4])
    with pytest.raises(InfeasibleConfig, match="runtime compile_dynamic: this model fixes its sequence length"), \
            torch.no_grad():
        fn(ids[:, :20], mask[:, :20])


def sequence_spec(model: nn.Module) -> ModelSpec:
    rows = [length for lengths in LENGTHS for length in lengths]
    sample = right_padded(rows)
    # evaluation batches padded to different widths, as labelled data is encoded batch by batch
    evaluation = [(trim_to_longest(tuple(t[i : i + 2] for t in sample), 1), torch.arange(i, i + 2))
                  for i in range(0, len(rows), 2)]
    return ModelSpec(name="seq", build=lambda: model, metric=OUTPUT_SUM, padding_mask=1,
                     example_inputs=lambda b: tuple(t[:b] for t in sample), calibration=lambda: [sample],
                     evaluation=lambda: evaluation, latency_batch_sizes=(2,))


def test_the_evaluator_times_the_dynamic_runtime_at_the_batchs_own_length(encoder: nn.Module) -> None:
    """No bucket under the dynamic runtime (nor its cost); the metric is eager's, over evaluation
    batches of several widths; the static runtime still measures what its bucket costs."""
    spec = sequence_spec(encoder)
    assert not get_runtime("compile_dynamic").static_shapes and get_runtime("compile_dynamic").compiles
    torch.compiler.reset()
    eager = evaluate_model(encoder, spec, CPU, settings=QUICK)
    dynamic = evaluate_model(encoder, spec, CPU, runtime="compile_dynamic", settings=QUICK)
    lengths = dynamic.latency_inputs[2]
    assert lengths.measured_length == lengths.length == eager.latency_inputs[2].length
    assert lengths.trimmed_p50_ms is None and "bucket_overhead_pct_b2" not in dynamic.as_metrics()
    assert dynamic.metric_value == pytest.approx(eager.metric_value, abs=1e-5)
    assert dynamic.compile_seconds > 0
    static = evaluate_model(encoder, spec, CPU, runtime="compile", settings=QUICK)
    assert static.latency_inputs[2].measured_length > lengths.length
    assert "bucket_overhead_pct_b2" in static.as_metrics()


def test_the_search_config_accepts_the_runtime() -> None:
    assert "compile_dynamic" in SearchConfig(runtimes=("compile", "compile_dynamic")).runtimes


def test_a_torch_without_isolated_recompiles_does_not_offer_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11's ``torch.compile`` has no ``isolate_recompiles``: the runtime is not offered there (it failed
    every trial with a TypeError on the H100's torch 2.11), and is where torch has it."""
    assert COMPILE_DYNAMIC.available(CPU) == compile_dynamic.ISOLATES_RECOMPILES
    monkeypatch.setattr(compile_dynamic, "ISOLATES_RECOMPILES", False)
    assert not COMPILE_DYNAMIC.available(CPU)
    assert COMPILE.available(CPU)
