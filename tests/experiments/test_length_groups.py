"""The length-groups bench (experiments/bench/length_groups.py): the product's grouped call timed against the padded
one on a recipe's or a peer's file; its rendering."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from paretorch.experiments.bench import length_groups
from paretorch.experiments.bench.length_groups import measure, render
from paretorch.pipeline.core.latency import LatencySettings
from tests.stages.test_pack_apply import SPEC_SOURCE

FEW_ROUNDS = LatencySettings(warmup_runs=1, min_runs=1, min_seconds=0.0, rounds=4, round_runs=1, round_seconds=0.0)


def test_a_grouped_call_is_timed_against_the_padded_one_and_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    # A few paired rounds, not the bench's thorough budget (a minute here): what is asserted (the groups, the widths,
    # the output change, the rendering) does not depend on how long each side is timed.
    monkeypatch.setattr(length_groups, "BENCH_LATENCY", FEW_ROUNDS)
    namespace: dict[str, object] = {}
    exec(compile(SPEC_SOURCE, "tiny_bert.py", "exec"), namespace)  # the tiny BERT spec of the pack tests
    spec = namespace["spec"]()  # type: ignore[operator]
    model = spec.build()
    widths: list[int] = []

    def fn(ids: Tensor, mask: Tensor) -> Tensor:
        widths.append(int(ids.shape[1]))
        return model(ids, mask)

    result = measure(fn, spec, [2, 8], batch=8, device=torch.device("cpu"))
    assert [row["rows_per_group"] for row in result["rows"]] == [2, 8]
    assert [row["groups"] for row in result["rows"]] == [4, 1]
    assert result["longest"] == 16 and min(widths) < 16, "groups of 2 ran narrower than the batch"
    assert all(row["max_abs_change"] < 1e-4 for row in result["rows"])
    result |= {"recipe": "pack | ort", "runtime": "onnxruntime", "date": "today", "threads": 1}
    table = render(result)
    assert "| 2 (4) |" in table and "| 8 (1) |" in table
