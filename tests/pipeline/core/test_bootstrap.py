"""The paired bootstrap of the metric drop (issue 26.3): fixed resamples, checked against hand computations."""

from __future__ import annotations

import pytest
import torch

from pipeline.core.bootstrap import RESAMPLES, drop_interval, percentile, resample_indices
from pipeline.core.evaluate import metric_resamples
from pipeline.core.ranking import row_spearman, spearman
from pipeline.core.spec import ACCURACY
from pipeline.core.task_metrics import pairs_metric, retrieval_metrics


def test_percentile_interpolates_between_order_statistics() -> None:
    # 5 values: the 2.5 % quantile sits at position 0.1, the 97.5 % one at 3.9 of the sorted list.
    assert percentile([0.3, 0.0, 0.2, 0.0, 0.1], 0.025) == pytest.approx(0.0)
    assert percentile([0.3, 0.0, 0.2, 0.0, 0.1], 0.975) == pytest.approx(0.2 + 0.9 * 0.1)
    assert percentile([1.0, 2.0], 0.5) == pytest.approx(1.5)


def test_drop_interval_on_a_toy_metric_by_hand() -> None:
    baseline = [0.5, 0.6, 0.7, 0.8, 0.9]
    trial = [0.4, 0.6, 0.5, 0.8, 0.6]  # drops 0.1, 0, 0.2, 0, 0.3 -> sorted 0, 0, 0.1, 0.2, 0.3
    low, high = drop_interval(baseline, trial, higher_is_better=True) or (None, None)
    assert low == pytest.approx(0.0)
    assert high == pytest.approx(0.29)
    # Lower is better: the same numbers are gains, the drop is their negative.
    low, high = drop_interval(baseline, trial, higher_is_better=False) or (None, None)
    assert (low, high) == (pytest.approx(-0.29), pytest.approx(0.0))
    assert drop_interval((), trial, higher_is_better=True) is None  # a baseline stored before resamples
    assert drop_interval(baseline, trial[:4], higher_is_better=True) is None


def test_accuracy_interval_against_a_hand_computation_on_the_fixed_resamples() -> None:
    """Four examples; the baseline gets all right, the trial misses example 1. On a resample the drop is the
    share of draws that picked example 1: counted by hand from the resample indices, then the percentiles."""
    labels = torch.tensor([0, 1, 0, 1])
    right = torch.nn.functional.one_hot(labels, 2).float()
    wrong = right.clone()
    wrong[1] = torch.tensor([1.0, 0.0])
    baseline = metric_resamples(ACCURACY, right, labels)
    trial = metric_resamples(ACCURACY, wrong, labels)
    assert len(baseline) == RESAMPLES and set(baseline) == {1.0}
    rows = resample_indices(4).tolist()
    drops = sorted(sum(1 for i in row if i == 1) / 4 for row in rows)
    position_low, position_high = 0.025 * (RESAMPLES - 1), 0.975 * (RESAMPLES - 1)  # 4.975 and 194.025
    expected_low = drops[4] + (position_low - 4) * (drops[5] - drops[4])
    expected_high = drops[194] + (position_high - 194) * (drops[195] - drops[194])
    low, high = drop_interval(baseline, trial, higher_is_better=True) or (None, None)
    assert low == pytest.approx(expected_low) and high == pytest.approx(expected_high)
    assert 0.0 <= low < 0.25 < high <= 1.0  # the point drop (0.25) lies inside


def test_resamples_are_the_same_for_every_trial() -> None:
    """Paired: two evaluations of the same number of units draw the same resamples, in any order."""
    first = resample_indices(1352)
    torch.manual_seed(123)  # the global generator plays no part
    torch.rand(10)
    assert torch.equal(resample_indices(1352), first)
    assert first.shape == (RESAMPLES, 1352)
    assert not torch.equal(first[0], first[1])


def test_pairs_resamples_are_paired_pair_by_pair() -> None:
    """Spearman on resample i of a trial and of the baseline: both computed on the same pairs (checked
    directly on resample 0 and 7), so the drop is the difference on one draw."""
    generator = torch.Generator().manual_seed(0)
    rows, pairs = 30, 40
    first = torch.randint(rows, (pairs,), generator=generator).tolist()
    second = torch.randint(rows, (pairs,), generator=generator).tolist()
    scores = torch.rand(pairs, generator=generator).tolist()
    metric = pairs_metric(first, second, scores, rows)
    targets = torch.arange(rows)
    base = torch.randn(rows, 8, generator=generator)
    trial = base + 0.5 * torch.randn(rows, 8, generator=generator)
    base_values, trial_values = (metric_resamples(metric, o, targets) for o in (base, trial))
    indices = resample_indices(pairs)

    def direct(outputs: torch.Tensor, draw: int) -> float:
        unit = torch.nn.functional.normalize(outputs, dim=1)
        cosine = (unit[first] * unit[second]).sum(dim=1)
        picked = indices[draw]
        return float(100.0 * spearman(cosine[picked], torch.tensor(scores)[picked]))

    for draw in (0, 7):
        assert base_values[draw] == pytest.approx(direct(base, draw), abs=1e-4)
        assert trial_values[draw] == pytest.approx(direct(trial, draw), abs=1e-4)
    same = drop_interval(base_values, metric_resamples(metric, base.clone(), targets), higher_is_better=True)
    assert same == (0.0, 0.0)  # the unchanged model: every paired drop is exactly zero


def test_row_spearman_matches_spearman_row_by_row_with_ties() -> None:
    x = torch.tensor([[1.0, 2.0, 2.0, 3.0], [4.0, 1.0, 1.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    y = torch.tensor([[1.0, 3.0, 2.0, 4.0], [1.0, 2.0, 2.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    got = row_spearman(x, y)
    for row in range(3):
        assert float(got[row]) == pytest.approx(float(spearman(x[row], y[row])), abs=1e-6)
    assert float(got[2]) == 0.0  # a constant row


def test_ndcg_resamples_the_queries() -> None:
    """Two queries, one found first (nDCG 1), one found nowhere in the top 10 of 11 documents (nDCG 0): each
    resample's nDCG is the share of draws of query 0."""
    relevance = torch.zeros(2, 11)
    relevance[0, 0] = relevance[1, 10] = 1.0
    ndcg = retrieval_metrics(2, relevance)[0]
    documents = torch.eye(11)
    queries = torch.stack([documents[0], -documents[10]])
    outputs = torch.cat([queries, documents])
    values = metric_resamples(ndcg, outputs, torch.arange(13))
    expected = [sum(1 for i in row if i == 0) / 2 for row in resample_indices(2).tolist()]
    assert values == pytest.approx(expected)
