"""The published tail-guard calibration (experiments/bench/results/tail-guard.json) judged by the guard paretorch
ships: it rejects the depth-pruning family and passes MiniLM's and digits' int8, bf16 and pack recipes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paretorch.experiments.bench import tail_guard
from paretorch.pipeline.core.input_agreement import COSINE_FLOOR, TAIL_LIMIT, TailGuard
from paretorch.pipeline.search.config import SearchConfig

RESULT = Path(tail_guard.__file__).parent / "results" / tail_guard.RESULT_FILE
LOSSLESS = ("fp32", "int8 dynamic", "int8 static (PT2E)", "bf16 AMP", "pack", "pack + int8 dynamic")


@pytest.mark.skipif(not RESULT.is_file(), reason=f"no {RESULT.name}")
def test_the_shipped_guard_rejects_the_depth_family_and_passes_what_loses_nothing() -> None:
    result = json.loads(RESULT.read_text())
    config = SearchConfig.load(None)
    assert (config.tail_limit, config.tail_cosine) == (TAIL_LIMIT, COSINE_FLOOR), "the defaults are these"
    guard = config.tail_guard()
    below = f"below_{COSINE_FLOOR:g}"

    def fails(rows: dict[str, float]) -> bool:
        return guard.failure({"input_cosine_p01": rows["p01"], "inputs_broken_share": rows[below]}) is not None

    by_name = {row["variant"]: row for row in result["minilm"]}
    for name in LOSSLESS:
        assert not fails(by_name[name]["task"]), name
        assert not fails(by_name[name]["sts"]), f"{name}: the labelled pairs' sentences pass too"
    depth = [row for row in result["minilm"] if row["variant"].startswith("depth")]
    assert len(depth) >= 4 and all(fails(row["task"]) for row in depth), "the guard sees it on the spec's rows"
    assert all(fails(row["sts"]) for row in depth), "and the labelled sentences confirm the tail"
    for row in result["digits"]:
        judged = guard.failure({"input_flip_share": row["input_flip_share"],
                                "inputs_broken_share": row["inputs_broken_share"]})
        assert (judged is None) == (row["variant"] != "prune 0.3"), row["variant"]


def test_the_guard_default_is_one_table() -> None:
    assert TailGuard() == SearchConfig.load(None).tail_guard()
