"""Length-grouped calls (experiments/bench/length_groups.py): each group trimmed, the rows back in their order."""

from __future__ import annotations

import torch

from experiments.bench.length_groups import grouped_call


def masked_mean(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A per-row output that padding does not change (a masked mean of the ids), and the widths it was called at."""
    masked_mean.widths.append(int(ids.shape[1]))  # type: ignore[attr-defined]
    return (ids.float() * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)


def test_groups_are_trimmed_to_their_own_longest_row_and_rows_keep_their_order() -> None:
    lengths = torch.tensor([7, 2, 5, 3, 9, 1])
    mask = (torch.arange(9)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, 50, (6, 9)) * mask
    masked_mean.widths = []  # type: ignore[attr-defined]
    expected = masked_mean(ids, mask)

    masked_mean.widths = []  # type: ignore[attr-defined]
    got = grouped_call(masked_mean, 3, mask_index=1)(ids, mask)

    assert torch.equal(got, expected)
    assert masked_mean.widths == [2, 5, 9]  # type: ignore[attr-defined]  # (1, 2), (3, 5), (7, 9)
