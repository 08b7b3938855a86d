"""A deployed encoder's ``encode`` (paretorch.pipeline.core.text_batches): rows back in input order, a batch tokenized
ahead while the model runs (injected delays on both sides), and one clear error without a tokenizer."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

import pytest
import torch
from torch import Tensor

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.text_batches import TextBatches

DELAY_S = 0.04


class Recorded(TextBatches):
    """Output row = (text length, sum of its ids); each side sleeps :data:`DELAY_S` and records when it ran."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.spans: dict[str, list[tuple[float, float]]] = {"tokenize": [], "model": []}
        self.encode_text = self.tokenize
        self.widths: list[int] = []

    def tokenize(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        start = time.perf_counter()
        time.sleep(self.delay)
        width = max(len(t) for t in texts)
        ids = torch.tensor([[1 + ord(c) for c in t] + [0] * (width - len(t)) for t in texts])
        self.spans["tokenize"].append((start, time.perf_counter()))
        return ids, (ids > 0).long()

    def padded(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        start = time.perf_counter()
        time.sleep(self.delay)
        self.widths.append(int(input_ids.shape[1]))
        out = torch.stack([attention_mask.sum(1).float(), (input_ids * attention_mask).sum(1).float()], dim=1)
        self.spans["model"].append((start, time.perf_counter()))
        return out


TEXTS = ["a fairly long sentence", "b", "ccc", "a sentence", "dd", "the longest sentence of them all", "e", "ffff"]


def expected(texts: Sequence[str]) -> Tensor:
    return torch.tensor([[len(t), sum(1 + ord(c) for c in t)] for t in texts], dtype=torch.float32)


@pytest.mark.parametrize("batch_size", [1, 3, 8, 32])
def test_a_sorted_corpus_comes_back_in_input_order(batch_size: int) -> None:
    encoder = Recorded()
    assert torch.equal(encoder.encode(TEXTS, batch_size=batch_size), expected(TEXTS))


def test_sorting_batches_similar_lengths_together() -> None:
    sorted_widths, given_widths = Recorded(), Recorded()
    sorted_widths.encode(TEXTS, batch_size=2)
    given_widths.encode(TEXTS, batch_size=2, sort=False)
    assert sorted_widths.widths == sorted(sorted_widths.widths, reverse=True), "longest first"
    assert sum(sorted_widths.widths) < sum(given_widths.widths), "less padding than in the given order"


def test_the_next_batch_is_tokenized_while_the_model_runs() -> None:
    encoder = Recorded(DELAY_S)
    start = time.perf_counter()
    out = encoder.encode(TEXTS, batch_size=1, overlap=True)
    wall = time.perf_counter() - start
    assert torch.equal(out, expected(TEXTS))
    overlapping = sum(1 for t0, t1 in encoder.spans["tokenize"] for m0, m1 in encoder.spans["model"]
                      if t0 < m1 and m0 < t1)
    assert overlapping >= len(TEXTS) - 2, "every tokenization but the first ran beside a model call"
    assert wall < 2 * DELAY_S * len(TEXTS), "below the sum of both sides' delays"
    serial = Recorded(DELAY_S)
    serial.encode(TEXTS, batch_size=1, overlap=False)
    assert not any(t0 < m1 and m0 < t1 for t0, t1 in serial.spans["tokenize"] for m0, m1 in serial.spans["model"])


def test_overlap_by_default_only_where_a_core_is_spare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert not Recorded().overlap_pays(), "one core for the model and the tokenizer: no overlap"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert Recorded().overlap_pays()
    on_gpu = Recorded()
    on_gpu.device = torch.device("cuda")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert on_gpu.overlap_pays(), "the accelerator runs the model"


def test_the_worker_thread_is_gone_after_encode() -> None:
    Recorded().encode(TEXTS, batch_size=2, overlap=True)
    assert not [t for t in threading.enumerate() if t.name.startswith("paretorch-tokenize")]


def test_without_a_tokenizer_or_with_bad_input_one_clear_error() -> None:
    bare = Recorded()
    bare.encode_text = None
    with pytest.raises(ConfigError, match="load_deployment"):
        bare.encode(TEXTS)
    with pytest.raises(TypeError, match="not one string"):
        Recorded().encode("one text")
    with pytest.raises(ValueError, match="at least one text"):
        Recorded().encode([])


class Prepared(Recorded):
    """Records which thread ran each batch's host preparation and which ran the model."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: dict[str, set[str]] = {"prepare": set(), "run": set()}

    def prepare(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        self.threads["prepare"].add(threading.current_thread().name)
        return input_ids, attention_mask

    def run_prepared(self, prepared: tuple[Tensor, Tensor]) -> Tensor:
        self.threads["run"].add(threading.current_thread().name)
        return self.padded(*prepared)


def test_a_batchs_host_work_is_done_ahead_beside_the_model_and_the_model_runs_on_the_callers_thread() -> None:
    encoder = Prepared()
    out = encoder.encode(TEXTS, batch_size=2, overlap=True)
    torch.testing.assert_close(out, expected(TEXTS))
    assert encoder.threads["run"] == {threading.current_thread().name}
    assert encoder.threads["prepare"] and all(name.startswith("paretorch-tokenize")
                                              for name in encoder.threads["prepare"])
    alone = Prepared()
    alone.encode(TEXTS, batch_size=2, overlap=False)
    assert alone.threads["prepare"] == alone.threads["run"] == {threading.current_thread().name}


class ThreadsSeen(Recorded):
    """Records torch's CPU threads while each batch runs."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.threads: list[int] = []

    def padded(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        self.threads.append(torch.get_num_threads())
        return super().padded(input_ids, attention_mask)


class DeviceLost(ThreadsSeen):
    def padded(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        raise RuntimeError("device lost")


@pytest.mark.parametrize("device, inside", [("cuda", 1), ("mps", 1), ("cpu", 2)])
def test_an_accelerator_encodes_with_one_torch_thread_and_restores_the_callers(device: str, inside: int) -> None:
    """On an accelerator torch's host work is padding and copies: one thread for the call, so idle intra-op threads
    do not spin on the tokenizer's cores; on the CPU the caller's threads run the model. Restored either way."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        encoder = ThreadsSeen(torch.device(device))
        assert torch.equal(encoder.encode(TEXTS, batch_size=3, overlap=False), expected(TEXTS))
        assert encoder.threads == [inside] * 3
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="device lost"):
            DeviceLost(torch.device(device)).encode(TEXTS, batch_size=3)
        assert torch.get_num_threads() == 2, "a batch that raised restores the caller's threads too"
    finally:
        torch.set_num_threads(before)
