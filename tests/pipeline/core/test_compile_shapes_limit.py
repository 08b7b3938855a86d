"""The static-shape compile runtime keeps compiling past dynamo's default of 8 graphs a frame: one graph per shape is
its design (length buckets, a packed model's token buckets), and past the limit dynamo runs the frame eager
silently."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import Tensor, nn
from torch._dynamo.utils import counters

from paretorch.pipeline.core.runtimes import compile as compile_runtime
from paretorch.pipeline.core.runtimes.compile import RECOMPILE_LIMIT
from paretorch.pipeline.core.runtimes.registry import prepare_runtime

CPU = torch.device("cpu")


class Scale(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * 2.0 + 1.0


@pytest.fixture
def default_limit() -> Iterator[None]:
    with torch._dynamo.config.patch(recompile_limit=8):
        yield


def test_twelve_shapes_compile_twelve_graphs(default_limit: None) -> None:
    torch.compiler.reset()
    counters.clear()
    fn = prepare_runtime(Scale().eval(), "compile", CPU)
    assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT >= 12
    for rows in range(1, 13):
        x = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
        assert torch.equal(fn(x), x * 2.0 + 1.0)
    assert counters["stats"]["unique_graphs"] == 12, "every shape compiled, none left to eager"


def test_a_higher_limit_set_by_the_user_is_kept() -> None:
    with torch._dynamo.config.patch(recompile_limit=500):
        compile_runtime.allow_bucket_graphs()
        assert torch._dynamo.config.recompile_limit == 500
