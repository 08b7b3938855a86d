"""A Pareto trial's profile: a Chrome trace and a top-operators table."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from paretorch.pipeline.search.finish import TABLE_FILE, TRACE_FILE, profile_calls


def test_profile_writes_a_chrome_trace_and_the_top_operators(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).eval()
    paths = profile_calls(model, (torch.randn(4, 8),), torch.device("cpu"), tmp_path / "trial-001", calls=3)
    assert [p.name for p in paths] == [TRACE_FILE, TABLE_FILE]
    events = json.loads(paths[0].read_text())["traceEvents"]
    assert any("addmm" in str(e.get("name", "")) for e in events)
    table = paths[1].read_text()
    assert table.startswith("torch.profiler, 3 calls on cpu") and "aten::addmm" in table
