"""A fast tokenizer's batches (paretorch.pipeline.sources.huggingface.PaddedBatches) are what transformers' own call
returns: the same ids and mask, padded to the longest text, truncated to the model's length, special tokens included."""

from __future__ import annotations

import pytest
import torch

from paretorch.experiments.models import minilm
from paretorch.pipeline.sources import huggingface
from paretorch.pipeline.sources.huggingface import PaddedBatches, encode_texts

TEXTS = ["A man is playing a guitar.", "", "short", "Ünïcödé, emoji 🙂 and numbers 1,234.5!",
         "word " * 400, "  leading and trailing spaces  ", "A child is riding a horse."]


@pytest.mark.parametrize("max_tokens", [256, 8])
def test_the_rust_batch_call_equals_the_tokenizers_own(max_tokens: int) -> None:
    tokenizer = minilm._tokenizer()
    batches = PaddedBatches.of(tokenizer, max_tokens)
    assert batches.backend is not None  # the fast path is the one under test
    ids, mask = batches(TEXTS)
    expected = tokenizer(TEXTS, padding="longest", truncation=True, max_length=max_tokens, return_tensors="pt")
    assert ids.dtype == mask.dtype == torch.int64
    assert torch.equal(ids, expected["input_ids"]) and torch.equal(mask, expected["attention_mask"])
    assert ids.shape[1] == max_tokens  # the long text is cut to the model's length
    assert torch.equal(encode_texts(tokenizer, TEXTS[:3], max_tokens)[0], expected["input_ids"][:3, :ids[:3].ne(0)
                                                                                                 .sum(1).max()])


def test_a_tokenizer_padded_on_the_left_is_called_as_it_is() -> None:
    tokenizer = minilm._tokenizer()
    left = type(tokenizer).from_pretrained(tokenizer.name_or_path, local_files_only=True, padding_side="left")
    batches = PaddedBatches(left, 32)
    assert batches.backend is None
    _, mask = batches(TEXTS[:3])
    assert mask[1, 0] == 0 and mask[1, -1] == 1  # padded on the left, as that tokenizer pads


def test_a_large_batch_tokenized_in_chunks_on_several_threads_is_the_same_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = minilm._tokenizer()
    texts = [f"{text} {i}" * (1 + i % 3) for i, text in enumerate(TEXTS * 40)]  # chunks of different widths
    monkeypatch.setattr(huggingface.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert huggingface.tokenizer_workers(len(texts)) == 4
    ids, mask = PaddedBatches.of(tokenizer, 256)(texts)
    expected = tokenizer(texts, padding="longest", truncation=True, max_length=256, return_tensors="pt")
    assert torch.equal(ids, expected["input_ids"]) and torch.equal(mask, expected["attention_mask"])
    monkeypatch.setattr(huggingface.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert huggingface.tokenizer_workers(len(texts)) == 1  # pinned to one core: one call
