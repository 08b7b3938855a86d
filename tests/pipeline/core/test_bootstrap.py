"""The paired bootstrap of the metric drop (issue 26.3): fixed resamples, checked against hand computations."""

from __future__ import annotations

import pytest
import torch

from paretorch.pipeline.core.bootstrap import (
    INDEX_BUDGET,
    MIN_RESAMPLES,
    RESAMPLES,
    drop_interval,
    percentile,
    resample_count,
    resample_indices,
)
from paretorch.pipeline.core.evaluate import metric_resamples
from paretorch.pipeline.core.ranking import row_spearman, spearman
from paretorch.pipeline.core.spec import ACCURACY
from paretorch.pipeline.core.task_metrics import pairs_metric, retrieval_metrics


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
    position_low, position_high = 0.025 * (RESAMPLES - 1), 0.975 * (RESAMPLES - 1)  # 49.975 and 1949.025
    below, above = int(position_low), int(position_high)
    expected_low = drops[below] + (position_low - below) * (drops[below + 1] - drops[below])
    expected_high = drops[above] + (position_high - above) * (drops[above + 1] - drops[above])
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


# --------------------------------------------------------------------------- the statistics against scipy


def test_the_drop_interval_matches_scipys_percentile_bootstrap() -> None:
    """The paired percentile bootstrap of an accuracy drop against scipy.stats.bootstrap (percentile method) on the
    same data: the ends agree within the Monte Carlo error of the two (different) resample draws."""
    stats = pytest.importorskip("scipy.stats")
    generator = torch.Generator().manual_seed(4)
    units = 500
    labels = torch.randint(0, 4, (units,), generator=generator)
    base_right = torch.rand(units, generator=generator) < 0.92
    trial_right = base_right & (torch.rand(units, generator=generator) < 0.97)

    def logits(right: torch.Tensor) -> torch.Tensor:
        predicted = torch.where(right, labels, (labels + 1) % 4)
        return torch.nn.functional.one_hot(predicted, 4).float()

    baseline = metric_resamples(ACCURACY, logits(base_right), labels)
    trial = metric_resamples(ACCURACY, logits(trial_right), labels)
    low, high = drop_interval(baseline, trial, higher_is_better=True) or (None, None)
    differences = (base_right.float() - trial_right.float()).numpy()
    reference = stats.bootstrap((differences,), lambda x, axis: x.mean(axis=axis), n_resamples=20000,
                                method="percentile", random_state=0, vectorized=True).confidence_interval
    assert low == pytest.approx(reference.low, abs=0.003) and high == pytest.approx(reference.high, abs=0.003)


def test_the_interval_ends_are_stable_to_a_tenth_of_a_point() -> None:
    """With the count used, two different resample draws move a 0-100 metric's interval ends by < 0.1 point."""
    generator = torch.Generator().manual_seed(5)
    values = 100.0 * (torch.rand(400, generator=generator) < 0.8).float()
    ends = []
    for seed in (1, 2, 3):
        means = values[resample_indices(400, seed=seed)].mean(dim=1).tolist()
        ends.append((percentile(means, 0.025), percentile(means, 0.975)))
    spread = max(max(e[i] for e in ends) - min(e[i] for e in ends) for i in (0, 1))
    assert resample_count(400) == RESAMPLES and spread < 0.5, spread


def test_a_large_evaluation_set_gets_fewer_resamples_within_the_memory_budget() -> None:
    assert resample_count(1_000) == RESAMPLES
    assert resample_count(1_000_000) == MIN_RESAMPLES
    assert resample_count(50_000) * 50_000 <= INDEX_BUDGET


def test_the_median_interval_holds_its_coverage_by_the_binomial() -> None:
    """:func:`paretorch.pipeline.core.noise.median_ci` picks order statistics of binomial coverage (scipy) >= 95 %."""
    stats = pytest.importorskip("scipy.stats")
    from paretorch.pipeline.core.noise import median_ci

    for n in range(6, 61):
        samples = [float(i) for i in range(n)]
        low, high = median_ci(samples)
        j = int(low)
        assert high == n - 1 - j
        coverage = 1.0 - 2.0 * stats.binom.cdf(j, n, 0.5)
        assert coverage >= 0.95, (n, j, coverage)
        if j + 1 < n // 2:  # the next narrower pair would not hold 95 %
            assert 1.0 - 2.0 * stats.binom.cdf(j + 1, n, 0.5) < 0.95, (n, j)
