"""The pack stage: packed execution equals padded execution (fp32 to 1e-5) on MiniLM and a small
random BERT, bucketing of the total token count, composition with pruning and bf16, the stage record.

The small BERT models are built here from ``BertConfig`` with random weights; nothing is downloaded.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch._dynamo.testing import CompileCounter
from transformers import BertConfig, BertForSequenceClassification, BertModel

from paretorch.pipeline.core.mirror import ExportMirror
from paretorch.pipeline.core.model_facts import ModelFacts
from paretorch.pipeline.core.padding import latency_sample, trim_to_longest
from paretorch.pipeline.core.spec import ACCURACY, ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply, export_mirror, get_stage
from paretorch.pipeline.sources.huggingface import ClassifierLogits, PooledEmbedding
from paretorch.stages.amp.stage import AmpConfig
from paretorch.stages.common.mirror_facts import PaddingFree
from paretorch.stages.pack.attention import choose_kernel
from paretorch.stages.pack.bert import find_packable
from paretorch.stages.pack.buckets import TOKEN_BUCKETS, geometric_buckets, smallest_bucket
from paretorch.stages.pack.layout import device_layout, host_starts, input_index
from paretorch.stages.pack.packed import PackedBert
from paretorch.stages.pack.stage import PackConfig, PackFacts, rules_out
from paretorch.stages.prune.stage import PruneConfig

CPU = torch.device("cpu")
FP32_TOLERANCE = 1e-5


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def bert_config(**overrides: Any) -> BertConfig:
    settings: dict[str, Any] = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 4,
                                "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 32}
    return BertConfig(**(settings | overrides))


def tiny_pooled(pooling: str = "mean", normalize: bool = False) -> PooledEmbedding:
    torch.manual_seed(0)
    return PooledEmbedding(BertModel(bert_config()), pooling=pooling, normalize=normalize).eval()


def tiny_classifier() -> ClassifierLogits:
    torch.manual_seed(0)
    return ClassifierLogits(BertForSequenceClassification(bert_config(num_labels=3))).eval()


def batch(lengths: list[int], width: int = 16, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Token ids and a right-padding mask with the given real lengths per row (padding ids are 0)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 100, (len(lengths), width), generator=generator)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


def tiny_spec(model: nn.Module) -> ModelSpec:
    inputs = batch([16, 12, 9, 3, 16, 5, 7, 11])
    return ModelSpec(
        name="tiny_bert", build=lambda: model, example_inputs=lambda rows: tuple(t[:rows] for t in inputs),
        calibration=lambda: [inputs], evaluation=lambda: [(inputs, torch.zeros(8, dtype=torch.long))],
        metric=ACCURACY, latency_batch_sizes=(1,), padding_mask=1,
    )


def max_diff(a: Tensor, b: Tensor) -> float:
    assert a.shape == b.shape
    return float((a.float() - b.float()).abs().max())


def packed_of(model: nn.Module, attention: str = "padded") -> PackedBert:
    paths = find_packable(model)
    assert not isinstance(paths, str), paths
    return PackedBert(model, paths, attention).eval()


# --------------------------------------------------------------------------- buckets


@pytest.mark.parametrize(("tokens", "expected"), [
    (0, 16), (1, 16), (16, 16), (17, 18), (24, 24), (25, 26), (33, 36), (1000, 1024), (1029, 1152),
    (65536, 65536), (65537, 131072), (200000, 262144),
])
def test_smallest_bucket_that_fits(tokens: int, expected: int) -> None:
    assert smallest_bucket(tokens) == expected


def test_smallest_bucket_is_the_least_bucket_holding_the_count() -> None:
    buckets = (8, 12, 16)
    for tokens in range(0, 17):
        chosen = smallest_bucket(tokens, buckets)
        assert chosen >= tokens and chosen in buckets
        assert all(b < tokens for b in buckets if b < chosen)


def test_buckets_waste_at_most_an_eighth() -> None:
    assert tuple(sorted(set(TOKEN_BUCKETS))) == TOKEN_BUCKETS
    assert geometric_buckets(16, 64, steps=2) == (16, 24, 32, 48, 64)
    for tokens in range(16, 65537, 13):
        assert smallest_bucket(tokens) / tokens <= 1.125


def test_negative_token_count_is_an_error() -> None:
    with pytest.raises(ValueError, match="negative"):
        smallest_bucket(-1)


def build_layout(mask: Tensor, bucket: bool) -> Any:
    return device_layout(*host_starts(mask, bucket))


def test_bucketed_layout_has_a_dummy_sequence_after_the_rows() -> None:
    _, mask = batch([5, 3, 0, 4])
    exact, bucketed = build_layout(mask, bucket=False), build_layout(mask, bucket=True)
    assert exact.gather_index.numel() == 12 and bucketed.gather_index.numel() == 16
    assert bucketed.width == 16 and exact.width == 5  # the longest row (5), in its bucket under static shapes
    assert bucketed.sequence_starts.tolist() == [0, 5, 8, 8, 12, 16]
    assert bucketed.rows.tolist() == [0] * 5 + [1] * 3 + [3] * 4 + [4] * 4
    assert bucketed.positions[:5].tolist() == [0, 1, 2, 3, 4] and bucketed.positions[8:12].tolist() == [0, 1, 2, 3]
    assert bucketed.scatter_index[12:].tolist() == [4 * 16] * 4
    assert bucketed.lengths.tolist() == [5, 3, 0, 4] and bucketed.first_tokens.tolist() == [0, 5, 8, 8]


# --------------------------------------------------------------------------- packed == padded


@pytest.mark.parametrize("attention", ["padded", "nested"])
@pytest.mark.parametrize("lengths", [[16, 12, 9, 3, 16, 5, 7, 11], [7], [10, 10, 10, 10]],
                         ids=["mixed", "one-sentence", "same-length"])
@pytest.mark.parametrize("head", ["mean", "cls", "mean-normalized", "classifier"])
def test_packed_equals_padded_on_a_small_bert(head: str, lengths: list[int], attention: str) -> None:
    model: nn.Module = tiny_classifier() if head == "classifier" else \
        tiny_pooled(head.split("-")[0], normalize=head.endswith("normalized"))
    packed = packed_of(copy.deepcopy(model), attention)
    inputs = batch(lengths)
    with torch.inference_mode():
        assert max_diff(packed(*inputs), model(*inputs)) < FP32_TOLERANCE


def test_bucketed_packing_equals_padded() -> None:
    model = tiny_pooled()
    packed = packed_of(copy.deepcopy(model))
    ids, mask = batch([16, 12, 9, 3, 5])
    layout = build_layout(mask, bucket=True)
    assert layout.gather_index.numel() == 48  # 45 real tokens -> bucket 48
    with torch.inference_mode():
        hidden = packed.encode(ids.reshape(-1).index_select(0, input_index(layout, 16)), layout)
        assert hidden.shape[0] == 48
        assert max_diff(packed.head(hidden, layout), model(ids, mask)) < FP32_TOLERANCE


def test_packed_shares_the_modules_and_names_of_the_padded_model() -> None:
    model = tiny_pooled()
    packed = packed_of(model)
    assert packed.encoder is model.encoder
    assert list(packed.state_dict()) == list(model.state_dict())
    assert {n for n, m in packed.named_modules() if isinstance(m, nn.Linear)} == \
        {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}


@pytest.fixture(scope="module")
def minilm() -> tuple[ModelSpec, nn.Module]:
    from paretorch.experiments.models.minilm import spec

    minilm_spec = spec()
    return minilm_spec, minilm_spec.build()


def test_packed_equals_padded_on_minilm(minilm: tuple[ModelSpec, nn.Module]) -> None:
    spec, model = minilm
    packed = packed_of(copy.deepcopy(model))
    sample = trim_to_longest(latency_sample(spec, 32), 1)
    ids, mask = sample
    one = trim_to_longest((ids[:1], mask[:1]), 1)
    same = (ids[:4, :10], torch.ones(4, 10, dtype=mask.dtype))
    with torch.inference_mode():
        for inputs in (sample, one, same):
            assert max_diff(packed(*inputs), model(*inputs)) < FP32_TOLERANCE
        # the spec's own padding (128 columns) too: the padded columns are never computed
        wide = spec.example_inputs(4)
        assert max_diff(packed(*wide), model(*wide)) < FP32_TOLERANCE


def test_nested_kernel_equals_padded_on_minilm(minilm: tuple[ModelSpec, nn.Module]) -> None:
    spec, model = minilm
    packed = packed_of(copy.deepcopy(model), "nested")
    inputs = trim_to_longest(latency_sample(spec, 32), 1)
    with torch.inference_mode():
        assert max_diff(packed(*inputs), model(*inputs)) < FP32_TOLERANCE


def test_packed_bf16_cast_is_close_to_padded_bf16(minilm: tuple[ModelSpec, nn.Module]) -> None:
    spec, model = minilm
    reduced = copy.deepcopy(model).to(torch.bfloat16)
    packed = packed_of(copy.deepcopy(reduced))
    inputs = trim_to_longest(latency_sample(spec, 32), 1)
    with torch.inference_mode():
        expected = model(*inputs)
        assert max_diff(packed(*inputs), expected) < 3e-2
        assert max_diff(packed(*inputs), reduced(*inputs)) < 3e-2


# --------------------------------------------------------------------------- the stage


def test_stage_packs_and_checks_against_the_padded_model() -> None:
    model = tiny_pooled()
    ctx = StageContext(spec=tiny_spec(model), device=CPU)
    packed = apply(model, PackConfig(), ctx)
    assert isinstance(packed, PackedBert) and packed.encoder is not model.encoder  # a copy
    assert ctx.records["pack.check_max_abs_diff"] < FP32_TOLERANCE


def test_stage_hands_back_an_unpackable_model_unchanged_with_the_reason(digits_spec: ModelSpec,
                                                                         digits_model: nn.Module) -> None:
    ctx = StageContext(spec=digits_spec, device=CPU)
    result = apply(digits_model, PackConfig(), ctx)
    assert type(result) is type(digits_model)
    assert "declares no padding mask" in ctx.records["pack.not_packed"]


@pytest.mark.parametrize("config", [PruneConfig(ratio=0.5, ffn_ratio=0.0), PruneConfig(ratio=0.5, head_ratio=0.0),
                                    PruneConfig(ratio=0.5, ffn_ratio=0.25), PruneConfig(method="depth", ratio=0.5)],
                         ids=["heads", "ffn", "heads-and-ffn", "depth"])
def test_composes_with_pruning(config: PruneConfig) -> None:
    spec = tiny_spec(tiny_pooled())
    pruned = apply(spec.build(), config, StageContext(spec=spec, device=CPU))
    packed = apply(pruned, PackConfig(), StageContext(spec=spec, device=CPU))
    assert isinstance(packed, PackedBert)
    inputs = batch([16, 2, 9, 13], seed=3)
    with torch.inference_mode():
        assert max_diff(packed(*inputs), pruned(*inputs)) < FP32_TOLERANCE


def test_composes_with_amp_bf16() -> None:
    model = tiny_pooled()
    spec = tiny_spec(model)
    packed = apply(model, PackConfig(), StageContext(spec=spec, device=CPU))
    amp_packed = apply(packed, AmpConfig(dtype="bfloat16", fp32_layers=()), StageContext(spec=spec, device=CPU))
    amp_padded = apply(model, AmpConfig(dtype="bfloat16", fp32_layers=()), StageContext(spec=spec, device=CPU))
    inputs = batch([16, 2, 9, 13], seed=3)
    with torch.inference_mode():
        reference = model(*inputs)
        assert max_diff(amp_packed(*inputs), amp_padded(*inputs)) < 5e-2
        assert 0 < max_diff(amp_packed(*inputs), reference) < 5e-2  # bf16 did run


def test_rules_out_models_it_cannot_pack() -> None:
    assert rules_out(PackConfig(), ModelFacts(scripted=False, stages={"pack": PackFacts(None)})) is None
    reason = rules_out(PackConfig(), ModelFacts(scripted=False, stages={"pack": PackFacts("no mask")}))
    assert reason == "no mask"  # the search prefixes the stage: "pack: no mask"
    assert "TorchScript" in str(rules_out(PackConfig(), ModelFacts(scripted=True)))


def test_facts_name_why_a_model_cannot_be_packed(digits_spec: ModelSpec, digits_model: nn.Module) -> None:
    stage = get_stage("pack")
    assert stage.facts is not None
    assert stage.facts(tiny_pooled(), StageContext(spec=tiny_spec(tiny_pooled()), device=CPU)) == PackFacts(None)
    facts = stage.facts(digits_model, StageContext(spec=digits_spec, device=CPU))
    assert "no padding mask" in str(facts.problem)
    roberta_like: Any = tiny_pooled()
    roberta_like.encoder.config.position_embedding_type = "relative_key"
    assert "relative_key" in str(find_packable(roberta_like))


def test_exports_convert_the_padded_model_and_say_so() -> None:
    stage = get_stage("pack")
    assert stage.numeric  # exports read ctx.float_model: the model before packing
    mirror = export_mirror([PackConfig()])
    assert mirror == ExportMirror((PaddingFree(),))  # file runtimes call the padded file per length group


def test_auto_kernel_on_cpu_is_padded() -> None:
    assert choose_kernel("auto", CPU, torch.float32) == "padded"
    with pytest.raises(ValueError, match="varlen attention needs CUDA"):
        choose_kernel("varlen", CPU, torch.bfloat16)


def test_compiled_packed_model_is_one_graph_after_reading_the_lengths() -> None:
    packed = packed_of(tiny_pooled())
    torch.compiler.reset()
    explanation = torch._dynamo.explain(packed)(*batch([16, 12, 9, 3]))
    # the row lengths are read first, outside the graph (torch.compiler.disable); no break after it, and the
    # index tensors are built inside the graph from the sequence starts
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    graph = explanation.graphs[0].graph
    assert not any("gather_index" in str(node.target) for node in graph.nodes if node.op == "placeholder")
    assert any("cumsum" in str(node.target) for node in graph.nodes)


def test_compiled_packed_model_compiles_once_per_token_bucket() -> None:
    packed = packed_of(tiny_pooled())
    torch.compiler.reset()
    counter = CompileCounter()
    compiled = torch.compile(packed, backend=counter, dynamic=False)
    with torch.inference_mode():
        for lengths in ([16, 12, 9, 3], [16, 12, 9, 2], [5, 5, 5, 5], [6, 4, 5, 5], [16, 16, 16, 16]):
            assert max_diff(compiled(*batch(lengths)), packed(*batch(lengths))) < FP32_TOLERANCE
    assert counter.frame_count == 3  # 40 and 39 tokens share bucket 40, 20 and 20 bucket 20, 64 its own


def test_compiled_one_row_call_traces_the_amp_stage_graph() -> None:
    """A one-row batch compiled runs the unpacked graph: op for op the graph of the amp stage's whole-model bf16 on
    the padded model (no layout, flex mask or float32 pooling). On an H200 (issue 33, MiniLM b1 under
    compile_cudagraphs) the two ran the same 67 kernels and the same compiled graph, paired 0.993x apart."""
    model = tiny_pooled(normalize=True)
    spec = tiny_spec(model)
    full = AmpConfig(dtype="bfloat16", fp32_layers=())
    amp = apply(copy.deepcopy(model), full, StageContext(spec=spec, device=CPU))
    packed = apply(copy.deepcopy(model), PackConfig(), StageContext(spec=spec, device=CPU))
    pack_amp = apply(packed, full, StageContext(spec=spec, device=CPU))
    assert isinstance(pack_amp, PackedBert)
    traced = []
    for candidate in (amp, pack_amp):
        torch.compiler.reset()
        explanation = torch._dynamo.explain(candidate)(*batch([11]))
        assert explanation.graph_count == 1 and explanation.graph_break_count == 0
        nodes = explanation.graphs[0].graph.nodes
        calls = ("call_function", "call_method", "call_module")
        traced.append([str(node.target) for node in nodes if node.op in calls])
    assert traced[0] == traced[1]
    assert not any(word in op for op in traced[1] for word in ("index_add", "cumsum", "flex"))
    with torch.inference_mode():
        assert max_diff(pack_amp(*batch([11])), amp(*batch([11]))) < 5e-2
