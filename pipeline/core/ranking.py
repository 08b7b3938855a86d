"""Rank statistics on the device: ranks with ties averaged, Spearman's rho, nDCG@k, recall@k.

They compute in float32, which every backend has (MPS has no float64); ranks stay exact
integers (or halves) up to 2**24 samples.

Every function takes and returns tensors (0-dim results), so that a metric built on
them runs where the outputs are and is read back once by the evaluator.
"""

from __future__ import annotations

import torch
from torch import Tensor


def average_ranks(values: Tensor) -> Tensor:
    """1-based ranks of a 1-D tensor, tied values sharing the mean of their ranks (as scipy's rankdata)."""
    if values.dim() != 1:
        raise ValueError(f"average_ranks takes a 1-D tensor, got shape {tuple(values.shape)}")
    values = values.float()
    order = torch.argsort(values, stable=True)
    sorted_values = values[order]
    # Start of each run of equal values, and the mean rank of each run.
    new_run = torch.ones_like(sorted_values, dtype=torch.bool)
    new_run[1:] = sorted_values[1:] != sorted_values[:-1]
    run_id = torch.cumsum(new_run.long(), dim=0) - 1
    positions = torch.arange(1, values.numel() + 1, dtype=torch.float32, device=values.device)
    run_sum = torch.zeros(int(run_id[-1]) + 1 if values.numel() else 0, dtype=torch.float32, device=values.device)
    run_sum.index_add_(0, run_id, positions)
    run_count = torch.zeros_like(run_sum).index_add_(0, run_id, torch.ones_like(positions))
    ranks = torch.empty_like(values)
    ranks[order] = (run_sum / run_count)[run_id]
    return ranks


def pearson(x: Tensor, y: Tensor) -> Tensor:
    """Pearson correlation of two 1-D tensors (0 when either is constant)."""
    if x.shape != y.shape or x.dim() != 1:
        raise ValueError(f"pearson needs two 1-D tensors of one shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    x = x.float() - x.float().mean()
    y = y.float() - y.float().mean()
    denominator = x.norm() * y.norm()
    return torch.where(denominator > 0, (x * y).sum() / denominator.clamp_min(1e-30), torch.zeros_like(denominator))


def spearman(x: Tensor, y: Tensor) -> Tensor:
    """Spearman's rank correlation: Pearson's of the tie-averaged ranks."""
    return pearson(average_ranks(x), average_ranks(y))


def row_average_ranks(values: Tensor) -> Tensor:
    """:func:`average_ranks` of each row of a 2-D tensor, all rows at once."""
    rows, width = values.shape
    values = values.float()
    order = torch.argsort(values, dim=1, stable=True)
    sorted_values = values.gather(1, order)
    new_run = torch.ones_like(sorted_values, dtype=torch.bool)
    new_run[:, 1:] = sorted_values[:, 1:] != sorted_values[:, :-1]
    # Each run of equal values gets an id unique over all rows: its index in its row, offset by row * width.
    offsets = torch.arange(rows, device=values.device).unsqueeze(1) * width
    run_id = (torch.cumsum(new_run.long(), dim=1) - 1 + offsets).flatten()
    positions = torch.arange(1, width + 1, dtype=torch.float32, device=values.device).repeat(rows)
    run_sum = torch.zeros(rows * width, dtype=torch.float32, device=values.device).index_add_(0, run_id, positions)
    run_count = torch.zeros_like(run_sum).index_add_(0, run_id, torch.ones_like(positions))
    mean_rank = (run_sum / run_count.clamp_min(1.0))[run_id].reshape(rows, width)
    return torch.empty_like(values).scatter_(1, order, mean_rank)


def row_spearman(x: Tensor, y: Tensor) -> Tensor:
    """Spearman's rho of each row of ``x`` with the same row of ``y`` (two 2-D tensors of one shape): ``(rows,)``,
    0 for a row where either side is constant."""
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"row_spearman needs two 2-D tensors of one shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    rx, ry = row_average_ranks(x), row_average_ranks(y)
    rx = rx - rx.mean(dim=1, keepdim=True)
    ry = ry - ry.mean(dim=1, keepdim=True)
    denominator = rx.norm(dim=1) * ry.norm(dim=1)
    return torch.where(denominator > 0, (rx * ry).sum(dim=1) / denominator.clamp_min(1e-30),
                       torch.zeros_like(denominator))


def ndcg_at_k(scores: Tensor, relevance: Tensor, k: int = 10) -> Tensor:
    """Mean nDCG@k over queries (:func:`query_ndcg_at_k`)."""
    return query_ndcg_at_k(scores, relevance, k).mean()


def query_ndcg_at_k(scores: Tensor, relevance: Tensor, k: int = 10) -> Tensor:
    """nDCG@k of each query: ``(queries,)``.

    ``scores``: (queries, documents) similarity of each query to each document;
    ``relevance``: (queries, documents) graded relevance (0 = not relevant). Gains are
    the grades (linear, as BEIR / pytrec_eval's ``ndcg_cut``), discounts 1/log2(rank + 1).
    Every query needs at least one relevant document.
    """
    _check_retrieval(scores, relevance)
    k = min(k, scores.shape[1])
    discounts = 1.0 / torch.log2(torch.arange(2, k + 2, dtype=torch.float32, device=scores.device))
    top = torch.topk(scores.float(), k, dim=1).indices
    dcg = (relevance.float().gather(1, top) * discounts).sum(dim=1)
    ideal = (torch.topk(relevance.float(), k, dim=1).values * discounts).sum(dim=1)
    return dcg / ideal


def recall_at_k(scores: Tensor, relevance: Tensor, k: int = 10) -> Tensor:
    """Mean over queries of (relevant documents in the top k) / (relevant documents)."""
    return query_recall_at_k(scores, relevance, k).mean()


def query_recall_at_k(scores: Tensor, relevance: Tensor, k: int = 10) -> Tensor:
    """(relevant documents in the top k) / (relevant documents) of each query: ``(queries,)``."""
    _check_retrieval(scores, relevance)
    k = min(k, scores.shape[1])
    relevant = relevance > 0
    top = torch.topk(scores.float(), k, dim=1).indices
    found = relevant.gather(1, top).sum(dim=1).float()
    return found / relevant.sum(dim=1).float()


def _check_retrieval(scores: Tensor, relevance: Tensor) -> None:
    if scores.dim() != 2 or scores.shape != relevance.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and relevance {tuple(relevance.shape)} must be one 2-D shape")
    if not bool((relevance > 0).any(dim=1).all()):
        raise ValueError("every query needs at least one relevant document")
