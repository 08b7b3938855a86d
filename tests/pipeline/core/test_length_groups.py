"""Length-grouped calls (pipeline/core/length_groups.py): rows sorted by length, one call per group trimmed to its
longest row, outputs back in the batch's order."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.length_groups import (
    GroupedEncoder,
    LengthGrouped,
    check_token_lists,
    groups_of,
    length_grouped,
    length_order,
)


def padded_batch(lengths: list[int], width: int) -> tuple[Tensor, Tensor]:
    ids = torch.arange(1, len(lengths) * width + 1).reshape(len(lengths), width)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


class Recording:
    """A loaded file stand-in: per-row outputs (the sum of each row's ids, its token count), the shapes it saw."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []

    def __call__(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.outputs((ids, mask))[0]

    def outputs(self, inputs: tuple[Tensor, ...]) -> list[Tensor]:
        ids, mask = inputs
        self.shapes.append((int(ids.shape[0]), int(ids.shape[1])))
        return [ids.sum(dim=1, keepdim=True).float(), mask.sum(dim=1).float()]

    def describe(self) -> str:
        return "recording"


LENGTHS = [3, 17, 5, 9, 1, 12, 30, 2, 8, 8, 4, 21, 6, 16, 7, 11, 25, 10, 13, 19]


def test_each_group_is_trimmed_to_its_longest_row_and_rows_come_back_in_order() -> None:
    ids, mask = padded_batch(LENGTHS, width=40)
    loaded = Recording()
    grouped = LengthGrouped(loaded, mask_index=1, rows=8)
    out = grouped(ids, mask)
    by_length = sorted(LENGTHS)
    assert loaded.shapes == [(8, by_length[7]), (8, by_length[15]), (4, by_length[19])]
    assert torch.equal(out, Recording()(ids, mask)), "every row's output is its own, in the batch's order"
    sums, tokens = grouped.outputs((ids, mask))
    assert torch.equal(tokens, torch.tensor(LENGTHS, dtype=torch.float32))
    assert torch.equal(sums, out)
    assert grouped.describe() == "recording; called per length group of 8 rows (pack)"


def test_a_batch_of_a_group_or_less_is_one_call_at_its_own_length() -> None:
    ids, mask = padded_batch([4, 2, 6], width=16)
    loaded = Recording()
    LengthGrouped(loaded, mask_index=1)(ids, mask)
    assert loaded.shapes == [(3, 6)]


def test_order_is_shortest_first_and_stable() -> None:
    _, mask = padded_batch([5, 2, 5, 1], width=8)
    assert length_order(mask).tolist() == [3, 1, 0, 2]
    assert [g.tolist() for g in groups_of(torch.arange(5), rows=2)] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="at least one row"):
        groups_of(torch.arange(5), rows=0)


def test_a_file_without_a_padding_mask_is_called_as_it_is() -> None:
    loaded = Recording()
    assert length_grouped(loaded, None) is loaded
    assert isinstance(length_grouped(loaded, 1), LengthGrouped)


def test_the_encoder_takes_token_lists_or_a_padded_batch() -> None:
    encoder = GroupedEncoder(LengthGrouped(Recording(), mask_index=1), max_length=12)
    lists = [[5, 6, 7], [1], [2, 3, 4, 5, 6]]
    expected = torch.tensor([[18.0], [1.0], [20.0]])
    assert torch.equal(encoder(lists), expected)
    ids, mask = padded_batch([3, 1, 5], width=12)
    assert encoder.padded(ids, mask).shape == (3, 1)
    for bad in ([], [[1, 2], []], [list(range(13))]):
        with pytest.raises(ValueError, match="1 to 12 ids each"):
            check_token_lists(bad, 12)
        with pytest.raises(ValueError, match="1 to 12 ids each"):
            encoder(bad)
    with pytest.raises(ValueError, match="padding mask must be input 1"):
        GroupedEncoder(LengthGrouped(Recording(), mask_index=0), max_length=12)


def test_outputs_that_are_not_one_row_per_input_row_are_an_error_not_a_wrong_answer() -> None:
    ids, mask = padded_batch([3, 9, 5, 1, 7, 2, 8, 4, 6, 10], width=12)
    fixed_size, one_row, scalar = (lambda i, m: torch.zeros(32)), (lambda i, m: i.float()[:1]), \
        (lambda i, m: i.float().sum())
    for output in (fixed_size, one_row, scalar):
        with pytest.raises(InfeasibleConfig, match="one output row per input row"):
            LengthGrouped(output, mask_index=1, rows=4)(ids, mask)
