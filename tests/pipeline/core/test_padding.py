"""Sequence latency inputs: each batch at its longest sample, length buckets for static shapes,
the bucket's cost measured, and the same outputs as full padding."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from paretorch.pipeline.core.evaluate import (
    LatencySettings,
    compute_metrics,
    evaluate_model,
    fixed_size_chunks,
    task_metric,
)
from paretorch.pipeline.core.padding import (
    BUCKETS,
    bucket_length,
    latency_inputs,
    longest,
    pad_to,
    representative_batch,
    to_bucket,
    trim_to_longest,
)
from paretorch.pipeline.core.runtimes.eager import Eager
from paretorch.pipeline.core.spec import Batch, Metric, ModelSpec
from paretorch.pipeline.sources.huggingface import PooledEmbedding

CPU = torch.device("cpu")
QUICK = LatencySettings(warmup_runs=1, min_runs=3, min_seconds=0.0)
#: Depends on every output value: equal metrics, equal outputs (to float noise).
OUTPUT_SUM = Metric("output_sum", higher_is_better=True, compute=lambda outputs, _targets: outputs.sum())
WIDTH = 128


def right_padded(lengths: list[int], width: int = WIDTH, seed: int = 0) -> Batch:
    """(input_ids, attention_mask, token_type_ids) right-padded to ``width``; id 0 is padding."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 500, (len(lengths), width), generator=generator)
    mask = (torch.arange(width) < torch.tensor(lengths).unsqueeze(1)).long()
    return ids * mask, mask, torch.zeros_like(ids)


@pytest.mark.parametrize(("length", "bucket"), [(1, 16), (16, 16), (17, 32), (33, 64), (64, 64), (65, 128),
                                                (128, 128), (129, 256), (512, 512), (600, 600)])
def test_bucketing_picks_the_smallest_bucket_that_fits(length: int, bucket: int) -> None:
    assert bucket_length(length) == bucket
    assert bucket_length(length, (8, 24)) == next((b for b in (8, 24) if b >= length), length)


def test_trim_cuts_trailing_padding_only() -> None:
    batch = right_padded([5, 23, 9])
    trimmed = trim_to_longest(batch, mask_index=1)
    assert longest(batch, 1) == 23
    assert [tuple(t.shape) for t in trimmed] == [(3, 23)] * 3
    assert all(torch.equal(t[:, :23], u) for t, u in zip(batch, trimmed, strict=True))
    # a non-sequence input (a per-sample scale) passes untouched
    scale = torch.ones(3, 1)
    assert trim_to_longest((*batch, scale), 1)[3] is scale


def test_bucket_is_never_narrower_than_the_longest_nor_wider_than_the_spec_pads() -> None:
    assert to_bucket(right_padded([5, 20]), 1)[1].shape[1] == 32
    assert to_bucket(right_padded([5, 16]), 1)[1].shape[1] == 16
    # the spec padded to 40: bucket 64 would be wider than the model was ever fed
    assert to_bucket(right_padded([35], width=40), 1)[1].shape[1] == 40


def test_pad_to_round_trip() -> None:
    batch = right_padded([5, 11], width=11)
    wider = pad_to(batch, 32, mask_index=1)
    assert [t.shape[1] for t in wider] == [32, 32, 32]
    assert int(wider[1][:, 11:].sum()) == 0 and int(wider[0][:, 11:].sum()) == 0
    assert all(torch.equal(t, u) for t, u in zip(trim_to_longest(wider, 1), batch, strict=True))
    # never cuts real tokens
    assert pad_to(batch, 4, mask_index=1)[1].shape[1] == 11


def test_representative_batch_is_the_one_of_median_length() -> None:
    # 5 batches of 2 rows, longest per batch: 40, 10, 30, 50, 20 -> median 30 (the third)
    lengths = [40, 3, 10, 2, 30, 5, 50, 1, 20, 4]
    sample = right_padded(lengths)
    chosen = representative_batch(sample, 2, mask_index=1)
    assert torch.equal(chosen[1], sample[1][4:6])
    assert representative_batch(sample, 1, 1)[1].sum() == sorted(lengths)[4]


class TinyEncoder(nn.Module):
    """A small BERT encoder with masked mean pooling: outputs must not depend on the padding."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        config = BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=WIDTH)
        self.inner = PooledEmbedding(BertModel(config), pooling="mean", normalize=True).eval()

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        return self.inner(input_ids, attention_mask)


@pytest.fixture(scope="module")
def encoder() -> nn.Module:
    return TinyEncoder().eval()


def test_per_batch_padding_gives_the_outputs_of_full_padding(encoder: nn.Module) -> None:
    batch = right_padded([7, 29, 12, 3])
    with torch.inference_mode():
        full = encoder(*batch)
        trimmed = encoder(*trim_to_longest(batch, 1))
        bucketed = encoder(*to_bucket(batch, 1))
    assert trim_to_longest(batch, 1)[0].shape[1] == 29 and to_bucket(batch, 1)[0].shape[1] == 32
    assert torch.allclose(full, trimmed, atol=1e-5) and torch.allclose(full, bucketed, atol=1e-5)


def sequence_spec(model: nn.Module, lengths: list[int]) -> ModelSpec:
    sample = right_padded(lengths)
    evaluation = [(tuple(t[i : i + 4] for t in sample), torch.arange(i, i + 4)) for i in range(0, len(lengths), 4)]
    return ModelSpec(
        name="seq", build=lambda: model, metric=OUTPUT_SUM, padding_mask=1,
        example_inputs=lambda b: tuple(t[:b] for t in sample),  # fewer rows than asked: repeated
        calibration=lambda: [sample], evaluation=lambda: evaluation, latency_batch_sizes=(1, 4),
    )


LENGTHS = [9, 40, 14, 22, 6, 31, 17, 25]


def test_latency_inputs_are_trimmed_eager_and_bucketed_for_static_shapes(encoder: nn.Module) -> None:
    spec = sequence_spec(encoder, LENGTHS)
    eager, lengths = latency_inputs(spec, 4, "eager")
    assert lengths is not None and eager[1].shape == (4, lengths.length)
    assert lengths.length == lengths.measured_length == max(LENGTHS[4:8])  # batches' longest 40, 31: median 31
    static, bucket = latency_inputs(spec, 4, "compile_cudagraphs")
    assert bucket is not None and static[1].shape == (4, 32) and bucket.length == 31 and bucket.measured_length == 32
    assert bucket.mean_tokens == pytest.approx(sum(LENGTHS[4:8]) / 4)
    one, single = latency_inputs(spec, 1, "eager")
    assert single is not None and one[1].shape == (1, sorted(LENGTHS)[3])  # the median sentence
    # no padding mask: the spec's example inputs as they are
    plain = ModelSpec(name="plain", build=lambda: encoder, metric=OUTPUT_SUM, padding_mask=None,
                      example_inputs=lambda b: right_padded(LENGTHS[:b]), calibration=list, evaluation=list)
    inputs, none = latency_inputs(plain, 4, "compile")
    assert none is None and inputs[1].shape == (4, WIDTH)


def test_bucket_cost_is_measured_and_the_metric_is_unchanged(encoder: nn.Module,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A static-shape runtime (stood in by eager: no compilation in a unit test) is timed at the bucket
    and at the batch's own length; the evaluation chunks in one bucket give the same metric."""
    spec = sequence_spec(encoder, LENGTHS)
    plain = evaluate_model(encoder, spec, CPU, settings=QUICK)
    assert plain.latency_inputs[4].measured_length == 31 and plain.latency_inputs[4].trimmed_p50_ms is None
    assert "bucket_overhead_pct_b4" not in plain.as_metrics()
    assert plain.as_metrics()["latency_tokens_b4"] == 31
    monkeypatch.setattr(Eager, "static_shapes", True)
    bucketed = evaluate_model(encoder, spec, CPU, settings=QUICK)
    lengths = bucketed.latency_inputs[4]
    assert (lengths.length, lengths.measured_length) == (31, 32) and lengths.trimmed_p50_ms is not None
    metrics = bucketed.as_metrics()
    assert metrics["latency_tokens_b4"] == 32 and metrics["latency_longest_tokens_b4"] == 31
    assert metrics["bucket_overhead_pct_b4"] == pytest.approx(
        100 * (bucketed.latency[4].p50_ms - lengths.trimmed_p50_ms) / lengths.trimmed_p50_ms)
    assert bucketed.metric_value == pytest.approx(plain.metric_value, abs=1e-6)


def test_evaluation_chunks_in_one_bucket_give_the_same_metric(encoder: nn.Module) -> None:
    spec = sequence_spec(encoder, LENGTHS)
    chunks = fixed_size_chunks(spec.evaluation(), 3, padding_mask=1)
    assert {chunk[1].shape[1] for chunk, _ in chunks} == {bucket_length(max(LENGTHS))} and BUCKETS[2] == 64
    full = compute_metrics(encoder, spec.evaluation(), (spec.metric,), CPU, 3)
    bucketed = compute_metrics(encoder, spec.evaluation(), (spec.metric,), CPU, 3, padding_mask=1)
    assert full == pytest.approx(bucketed, abs=1e-6)


def test_task_metric_scores_a_compiled_runtime_as_evaluate_model(encoder: nn.Module,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmarks' scoring (held-out checks, replayed recipes): a compiled runtime in chunks of the largest
    latency batch size cut to one bucket, exactly the chunks evaluate_model scores; any other per batch."""
    spec = sequence_spec(encoder, LENGTHS)
    shapes: list[tuple[int, ...]] = []

    def recording(*inputs: Tensor) -> Tensor:
        shapes.append(tuple(inputs[1].shape))
        return encoder(*inputs)

    plain = task_metric(recording, spec, CPU, "eager", (1, 3))
    assert set(shapes) == {(4, WIDTH)}, "the evaluation batches as they are"
    shapes.clear()
    monkeypatch.setattr(Eager, "compiles", True)
    chunked = task_metric(recording, spec, CPU, "eager", (1, 3))
    assert set(shapes) == {(3, bucket_length(max(LENGTHS)))}
    assert chunked == evaluate_model(encoder, spec, CPU, settings=QUICK, batch_sizes=(1, 3)).metric_value
    assert chunked == pytest.approx(plain, abs=1e-5)
