"""The pack stage's FlexAttention kernel: its block mask visits exactly the key blocks that share a sequence with
each query block, and the packed model with it equals the padded one on batches longer than one block.

Eager on the CPU (torch's unfused reference); the compiled kernel is what runs on CUDA (``auto`` inside a compiled
graph there). Small BERT models with random weights (``tests/stages/test_pack.py``'s); nothing is downloaded.
"""

from __future__ import annotations

import copy

import pytest
import torch

from paretorch.stages.pack.attention import FLEX_BLOCK, choose_kernel, document_blocks, flex_length
from paretorch.stages.pack.bert import find_packable
from paretorch.stages.pack.layout import (
    attention_width,
    device_layout,
    device_starts,
    host_sizes,
    host_starts,
    packed_length,
    starts_of,
)
from paretorch.stages.pack.packed import PackedBert
from tests.stages.test_pack import (
    CPU,
    FP32_TOLERANCE,
    batch,
    max_diff,
    one_thread,  # noqa: F401  (the autouse fixture: one torch thread)
    tiny_classifier,
    tiny_pooled,
)

#: 40 rows of 1 to 16 tokens: 332 packed tokens, three blocks of 128, sequences across block edges.
LENGTHS = torch.randint(1, 17, (40,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.mark.parametrize("bucket", [False, True], ids=["exact", "bucketed"])
def test_the_block_mask_visits_exactly_the_blocks_sharing_a_sequence(bucket: bool) -> None:
    _, mask = batch(LENGTHS)
    starts, tokens, width = host_starts(mask, bucket)
    layout = device_layout(starts, tokens, width)
    blocks = -(-tokens // FLEX_BLOCK)
    assert blocks >= 3
    same = layout.rows[:, None] == layout.rows[None, :]  # token x token: the same sequence (or both dummy)
    padded = torch.zeros(blocks * FLEX_BLOCK, blocks * FLEX_BLOCK, dtype=torch.bool)
    padded[:tokens, :tokens] = same
    expected = padded.view(blocks, FLEX_BLOCK, blocks, FLEX_BLOCK).any(dim=3).any(dim=1)
    dense = document_blocks(layout).to_dense()[0, 0].bool()
    assert torch.equal(dense, expected)


@pytest.mark.parametrize("make", [tiny_pooled, tiny_classifier])
def test_flex_packed_equals_padded_across_blocks(make: object) -> None:
    model = make()  # type: ignore[operator]
    packed = PackedBert(copy.deepcopy(model), find_packable(model), "flex").eval()
    for lengths in (LENGTHS, [1], [16, 16, 16, 16]):
        ids, mask = batch(lengths, seed=2)
        with torch.inference_mode():
            assert max_diff(packed(ids, mask), model(ids, mask)) < FP32_TOLERANCE


def test_auto_is_flex_only_inside_a_compiled_graph_on_cuda() -> None:
    cuda = torch.device("cuda")
    assert choose_kernel("auto", cuda, torch.float32) == "padded"  # eager, no varlen for float32
    assert choose_kernel("flex", CPU, torch.float32) == "flex"
    seen: list[str] = []

    def probe(x: torch.Tensor) -> torch.Tensor:
        seen.append(choose_kernel("auto", cuda, torch.bfloat16))
        return x + 1

    torch.compile(probe, backend="eager")(torch.zeros(2))
    assert seen == ["flex"]


@pytest.mark.parametrize("lengths", [[5], [5, 3], LENGTHS], ids=["one-row", "under-one-block", "three-blocks"])
def test_flex_runs_whole_blocks_with_the_tail_in_the_dummy_sequence(lengths: list[int]) -> None:
    # compiled on CUDA, a bucket shorter than one block gave wrong outputs unpadded (flex_length's docstring)
    _, mask = batch(lengths)
    layout = device_layout(*host_starts(mask, bucket=True))
    tokens = int(layout.rows.shape[0])
    length = flex_length(tokens)
    assert length % FLEX_BLOCK == 0 and tokens <= length < tokens + FLEX_BLOCK
    blocks = document_blocks(layout)
    assert tuple(blocks.seq_lengths) == (length, length)
    dense = blocks.to_dense()[0, 0].bool()  # the block ranges are those of the unpadded length
    assert dense.shape == (-(-tokens // FLEX_BLOCK),) * 2
    rows = torch.cat([layout.rows, layout.rows.new_full((length - tokens,), len(lengths))])
    query, key = torch.arange(length)[:, None], torch.arange(length)[None, :]
    assert torch.equal(blocks.mask_mod(0, 0, query, key), rows[:, None] == rows[None, :])


def test_the_padded_batch_path_reads_two_integers_and_builds_the_starts_on_the_device() -> None:
    _, mask = batch(LENGTHS)
    tokens, width = host_sizes(mask, bucket=True)
    assert (tokens, width) == (packed_length(sum(LENGTHS), True), attention_width(mask.shape[1], True)), (
        "static shapes: the batch's own width (one graph per token bucket)")
    assert host_sizes(mask, bucket=False) == (sum(LENGTHS), max(LENGTHS)), "eager: the exact count and longest row"
    wider = torch.cat([mask, mask.new_zeros(mask.shape[0], 40)], dim=1)
    assert host_sizes(wider, bucket=True)[1] == attention_width(wider.shape[1], True)
    assert device_starts(mask.ne(0).sum(dim=1), tokens).tolist() == starts_of(LENGTHS, tokens)
