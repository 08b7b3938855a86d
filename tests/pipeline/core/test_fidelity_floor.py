"""Fidelity floors: rows of their own after the task's, a floor metric against the unoptimized model,
and one verdict that keeps a trial below the floor off the front."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.evaluate import compute_metrics
from paretorch.pipeline.core.fidelity import MEAN_COSINE, PAIRWISE_RANK_CORRELATION, SQNR_DB
from paretorch.pipeline.core.fidelity_floor import floor_failures, with_fidelity_floor
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.task_data import PairsData
from paretorch.pipeline.core.task_spec import with_task_data
from paretorch.pipeline.search.objectives import FLOOR_REASON, Baseline, Objectives

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


# ---- the floor against the allowed drop, on small generated embeddings (issue 35)

def generated_embeddings(noise: float, rows: int = 120, width: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    """A reference set of unit embeddings and a copy moved by ``noise`` (fixed seeds: the same tensors every run)."""
    reference = nn.functional.normalize(torch.randn(rows, width, generator=torch.Generator().manual_seed(7)), dim=1)
    moved = reference + noise * torch.randn(rows, width, generator=torch.Generator().manual_seed(8))
    return reference, nn.functional.normalize(moved, dim=1)


def floor_value(noise: float) -> float:
    reference, moved = generated_embeddings(noise)
    return float(PAIRWISE_RANK_CORRELATION.compute(moved, reference))


def test_the_floor_rises_toward_a_perfect_value_as_the_allowed_drop_shrinks() -> None:
    [floor] = floored().fidelity_floors
    assert (floor.share, floor.perfect) == (0.01, 1.0)  # calibrated at 1 %; a rank correlation's best is 1
    assert floor.at(None) == floor.at(0.01) == floor.at(0.05) == 0.9  # at or above the calibration: as set
    assert floor.at(0.005) == pytest.approx(0.95) and floor.at(0.0) == 1.0
    assert floor.at(0.01 / 44.33) == pytest.approx(1 - 0.1 * 0.01 / 0.4433, rel=1e-3)  # --max-drop 0.01 on 0-100


def test_a_floor_metric_needs_a_best_value() -> None:
    with pytest.raises(SpecError, match="upper bound"):
        with_fidelity_floor(toy_spec(), encode(SENTENCES), SQNR_DB, "news_sqnr", 20.0, "toy")


def test_a_rising_task_metric_with_moved_embeddings_is_not_lossless() -> None:
    """The issue-35 case: the task score rises while the outputs move away from the unoptimized model's.
    Within the floor at 1 %, it is feasible there; at an absolute 0.01 on a 0-100 score ("lossless") it is not,
    while a model whose embeddings barely moved (int8-like) passes both."""
    moved, barely = floor_value(0.03), floor_value(0.002)
    assert 0.9 < moved < 0.99 and barely > 0.9998  # the generated sets sit where the test needs them
    spec = floored()
    baseline = Baseline(metric_value=44.33, latency_ms=10.0, size_bytes=1.0)
    risen = 46.89  # the word score rose 2.56 points
    for limit, moved_ok in (("1%", True), ("0.01", False)):
        objectives = Objectives.create(spec, ["metric", "latency"], limit)
        verdict = objectives.judge(baseline, risen, extras={"news_prc": moved})
        assert verdict.feasible is moved_ok
        if not moved_ok:
            assert verdict.reason is not None and verdict.reason.startswith(FLOOR_REASON)
            assert "raised from 0.9 for a drop below 1%" in verdict.reason and verdict.constraint > 0
        assert objectives.judge(baseline, risen, extras={"news_prc": barely}).feasible
        assert objectives.judge(baseline, 44.33, extras={"news_prc": 1.0}).feasible  # the baseline itself


def test_the_floor_ranks_generated_embeddings_by_how_far_they_moved() -> None:
    values = [floor_value(noise) for noise in (0.0, 0.002, 0.02, 0.05, 0.12, 0.4)]
    assert values[0] == pytest.approx(1.0) and values == sorted(values, reverse=True)
    [floor] = floored().fidelity_floors
    passing = [[floor.failure({"news_prc": v}, share) is None for v in values] for share in (0.01, 0.001, 0.0)]
    # a stricter limit accepts a prefix of the ranking, never a model a looser one rejects
    assert [sum(row) for row in passing] == sorted((sum(row) for row in passing), reverse=True)
    assert all(row == sorted(row, reverse=True) for row in passing)
    assert passing[2][0] and not passing[2][1]  # a zero drop accepts only unchanged outputs
