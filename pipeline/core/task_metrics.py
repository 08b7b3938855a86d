"""Task metrics over labelled evaluation data: top-k accuracy, pair similarity (Spearman x 100),
retrieval (nDCG@10, recall@k).

Pair and retrieval metrics need more than one output row per score, so the evaluation
rows of such a task are its distinct texts and the targets are the row numbers
(``0 .. rows-1``, checked); the metric holds which rows form a pair, or which are
queries and documents. Every metric computes on the device and returns a 0-dim tensor
(:class:`paretorch.pipeline.core.spec.Metric`); each primary metric also computes on the fixed bootstrap
resamples of its units (examples, pairs, queries: :mod:`paretorch.pipeline.core.bootstrap`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from paretorch.pipeline.core.bootstrap import resample_indices, resampled_means
from paretorch.pipeline.core.ranking import ndcg_at_k, query_ndcg_at_k, recall_at_k, row_spearman, spearman
from paretorch.pipeline.core.spec import ACCURACY, Metric

#: Name of the pairs metric (what sentence-similarity benchmarks report).
PAIRS_METRIC = "similarity_spearman"


def top_k_accuracy(k: int) -> Metric:
    """Share of samples whose label is among the ``k`` highest logits."""

    def correct(outputs: Tensor, targets: Tensor) -> Tensor:
        top = outputs.topk(min(k, outputs.shape[-1]), dim=-1).indices
        return (top == targets.unsqueeze(-1)).any(dim=-1)

    return Metric(f"top{k}_accuracy", higher_is_better=True, compute=lambda o, t: correct(o, t).float().mean(),
                  bounds=(0.0, 1.0), resampled=lambda o, t: resampled_means(correct(o, t)), rowwise=True)


def classification_metrics(classes: int) -> tuple[Metric, ...]:
    """Top-1 accuracy, plus top-5 where there are more than 5 classes."""
    return (ACCURACY, top_k_accuracy(5)) if classes > 5 else (ACCURACY,)


def _rows(outputs: Tensor, targets: Tensor, expected: int, name: str) -> Tensor:
    """The outputs as (rows, features), after checking that the targets are the row numbers in order."""
    if outputs.shape[0] != expected or not torch.equal(
            targets.to(torch.int64), torch.arange(expected, device=targets.device)):
        raise ValueError(f"{name}: expected the {expected} evaluation rows in order, got {outputs.shape[0]}")
    return torch.nn.functional.normalize(outputs.float().reshape(outputs.shape[0], -1), dim=1)


def pairs_metric(first: Sequence[int], second: Sequence[int], scores: Sequence[float], rows: int) -> Metric:
    """Spearman x 100 between cos(output[first[i]], output[second[i]]) and ``scores[i]``."""
    first_index = torch.tensor(first, dtype=torch.int64)
    second_index = torch.tensor(second, dtype=torch.int64)
    gold = torch.tensor(scores, dtype=torch.float32)

    def similarities(outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        embeddings = _rows(outputs, targets, rows, PAIRS_METRIC)
        device = embeddings.device
        cosine = (embeddings[first_index.to(device)] * embeddings[second_index.to(device)]).sum(dim=1)
        return cosine, gold.to(device)

    def compute(outputs: Tensor, targets: Tensor) -> Tensor:
        return 100.0 * spearman(*similarities(outputs, targets))

    def resampled(outputs: Tensor, targets: Tensor) -> Tensor:  # the pairs are the units
        cosine, scores = similarities(outputs, targets)
        indices = resample_indices(int(cosine.shape[0]), cosine.device)
        return 100.0 * row_spearman(cosine[indices], scores[indices])

    return Metric(PAIRS_METRIC, higher_is_better=True, compute=compute, bounds=(-100.0, 100.0), resampled=resampled)


def retrieval_metrics(queries: int, relevance: Tensor) -> tuple[Metric, ...]:
    """nDCG@10 (primary), recall@10 and recall@100 of queries (rows ``0 .. queries-1``) against the
    documents (the rows after them), by cosine similarity; ``relevance``: (queries, documents) gains."""
    rows = queries + relevance.shape[1]

    def scores(outputs: Tensor, targets: Tensor, name: str) -> tuple[Tensor, Tensor]:
        embeddings = _rows(outputs, targets, rows, name)
        return embeddings[:queries] @ embeddings[queries:].T, relevance.to(embeddings.device)

    def ndcg(outputs: Tensor, targets: Tensor) -> Tensor:
        return ndcg_at_k(*scores(outputs, targets, "ndcg_at_10"), k=10)

    def resampled_ndcg(outputs: Tensor, targets: Tensor) -> Tensor:  # the queries are the units
        return resampled_means(query_ndcg_at_k(*scores(outputs, targets, "ndcg_at_10"), k=10))

    def recall(k: int) -> Metric:
        name = f"recall_at_{k}"
        return Metric(name, higher_is_better=True, bounds=(0.0, 1.0),
                      compute=lambda outputs, targets: recall_at_k(*scores(outputs, targets, name), k=k))

    return (Metric("ndcg_at_10", higher_is_better=True, compute=ndcg, bounds=(0.0, 1.0), resampled=resampled_ndcg),
            recall(10), recall(100))
