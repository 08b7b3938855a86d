"""Fidelity floors: rows of their own after the task's, a floor metric against the unoptimized model,
and one verdict that keeps a trial below the floor off the front."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pipeline.core.errors import SpecError
from pipeline.core.evaluate import compute_metrics
from pipeline.core.fidelity import MEAN_COSINE, PAIRWISE_RANK_CORRELATION
from pipeline.core.fidelity_floor import floor_failures, with_fidelity_floor
from pipeline.core.spec import ModelSpec
from pipeline.core.task_data import PairsData
from pipeline.core.task_spec import with_task_data
from pipeline.search.objectives import FLOOR_REASON, Baseline, Objectives

CPU = torch.device("cpu")
VOCAB, WIDTH = 50, 8


class BagOfWords(nn.Module):
    """Mean of token embeddings under the mask: an embedding model with a padding mask."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.unsqueeze(-1).float()
        return (self.embed(ids) * weights).sum(1) / weights.sum(1).clamp(min=1)


def encode(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each word a token (hashed), padded to the longest text."""
    rows = [[1 + sum(map(ord, word)) % (VOCAB - 1) for word in text.split()] for text in texts]
    longest = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (longest - len(r)) for r in rows])
    return ids, (ids > 0).long()


MODEL = BagOfWords()
PAIRS = PairsData("toy", ("cat", "dog", "car", "sun", "tree"), ("kitten", "puppy", "truck", "moon", "leaf"),
                  (9.0, 8.5, 7.0, 5.0, 3.0))
SENTENCES = [f"the {a} saw a {b} near the {c} today" for a in ("cat", "man", "bird") for b in ("dog", "car", "sun")
             for c in ("tree", "house")]


def toy_spec() -> ModelSpec:
    base = ModelSpec(name="toy", build=lambda: copy.deepcopy(MODEL), example_inputs=lambda n: encode(["cat"] * n),
                     calibration=list, evaluation=list, metric=MEAN_COSINE, padding_mask=1, encode_text=encode,
                     output_kind="embedding")
    return with_task_data(base, PAIRS)


def floored() -> ModelSpec:
    return with_fidelity_floor(toy_spec(), encode(SENTENCES), PAIRWISE_RANK_CORRELATION, "news_prc", 0.9, "toy")


def damaged(scale: float) -> nn.Module:
    model = copy.deepcopy(MODEL)
    with torch.no_grad():
        model.embed.weight.add_(torch.randn(model.embed.weight.shape, generator=torch.Generator().manual_seed(1))
                                * scale)
    return model


def test_task_metric_sees_only_its_rows_and_the_floor_only_its_own() -> None:
    plain, spec = toy_spec(), floored()
    assert len(spec.evaluation()) == len(plain.evaluation()) + 1  # 18 sentences: one batch after the pairs
    for model in (MODEL, damaged(0.5)):
        before = compute_metrics(model, plain.evaluation(), (plain.metric, *plain.extra_metrics), CPU)
        after = compute_metrics(model, spec.evaluation(), (spec.metric, *spec.extra_metrics), CPU)
        assert {k: after[k] for k in before} == pytest.approx(before)
    assert compute_metrics(MODEL, spec.evaluation(), spec.extra_metrics, CPU)["news_prc"] == pytest.approx(1.0)


def test_rows_of_different_widths_are_padded_together_for_fixed_size_chunks() -> None:
    """A compiled runtime feeds fixed-size chunks: the pairs' words and the floor's sentences differ in width."""
    spec = floored()
    metrics = (spec.metric, *spec.extra_metrics)
    per_batch = compute_metrics(damaged(0.3), spec.evaluation(), metrics, CPU)
    chunked = compute_metrics(damaged(0.3), spec.evaluation(), metrics, CPU, batch_size=4, padding_mask=1)
    assert chunked == pytest.approx(per_batch, abs=1e-5)


def test_floor_failures_name_the_metric_and_the_floor() -> None:
    spec = floored()
    assert floor_failures(spec, {"news_prc": 0.95}) == []
    [reason] = floor_failures(spec, {"news_prc": 0.5})
    assert reason.startswith("news_prc 0.5000 < floor 0.9")
    assert "not measured" in floor_failures(spec, {})[0]


def test_a_floor_name_that_is_already_a_metric_is_refused() -> None:
    with pytest.raises(SpecError, match="already one of its metrics"):
        with_fidelity_floor(toy_spec(), encode(SENTENCES), MEAN_COSINE, "mean_cosine", 0.9, "toy")


def test_one_verdict_keeps_a_trial_below_the_floor_off_the_front() -> None:
    spec = floored()
    objectives = Objectives.create(spec, ["metric", "latency"], "1%")
    baseline = Baseline(metric_value=80.0, latency_ms=10.0, size_bytes=1.0)
    within = objectives.verdict(baseline, 79.5, extras={"news_prc": 0.95})
    assert within.feasible and within.constraint <= 0
    below = objectives.verdict(baseline, 79.5, extras={"news_prc": 0.5})
    assert not below.feasible and below.constraint > 0
    assert below.reason is not None and below.reason.startswith(FLOOR_REASON) and "news_prc 0.5000" in below.reason
    over = objectives.verdict(baseline, 70.0, extras={"news_prc": 0.5})
    assert not over.feasible and over.reason is not None and over.reason.startswith("drop ")
