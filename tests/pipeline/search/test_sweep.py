"""The runtime sweep covers the top few feasible stage lists, not only the fastest one."""

from __future__ import annotations

from collections.abc import Sequence

from paretorch.pipeline.core.stage import StageConfig, config_from_dict
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.search.record import COMPLETE, TrialRecord
from paretorch.pipeline.search.sweep import RuntimeSweepIndex

BF16 = config_from_dict({"stage": "amp", "dtype": "bfloat16"})
FP16 = config_from_dict({"stage": "amp", "dtype": "float16"})
INT8 = config_from_dict({"stage": "quantize", "method": "int8_dynamic"})
PRUNE = config_from_dict({"stage": "prune", "ratio": 0.3})
RUNTIMES = ["eager", "compile", "compile_cudagraphs"]


def record(number: int, stages: Sequence[StageConfig], runtime: str = "eager") -> TrialRecord:
    return TrialRecord(number=number, state=COMPLETE, runtime=runtime, recipe=Recipe(stages=tuple(stages),
                                                                                     runtime=runtime))


def proposed(index: RuntimeSweepIndex, top: int) -> list[tuple[int, str]]:
    return [(p.number, p.runtime) for p in index.proposals(RUNTIMES, top)]


def test_the_sweep_covers_the_top_k_feasible_stage_lists() -> None:
    index = RuntimeSweepIndex()
    index.add(record(0, []), 10.0)
    index.add(record(1, [BF16]), 4.0)
    index.add(record(2, [FP16]), 4.5)
    index.add(record(3, [INT8]), 8.0)
    index.add(record(4, [PRUNE]), None)  # over the allowed drop: never swept
    assert index.fastest == 4.0
    assert proposed(index, 1) == [(1, "compile"), (1, "compile_cudagraphs")]
    assert proposed(index, 3) == [(1, "compile"), (1, "compile_cudagraphs"), (2, "compile"),
                                  (2, "compile_cudagraphs"), (3, "compile"), (3, "compile_cudagraphs")]
    assert all(p.stages != (PRUNE.to_dict(),) for p in index.proposals(RUNTIMES, 10))
    assert index.proposals(["eager"], 3) == [], "one runtime: nothing to sweep"


def test_a_stage_list_leaves_the_sweep_once_tried_under_every_runtime_and_ranks_by_its_best() -> None:
    index = RuntimeSweepIndex()
    index.add(record(0, [BF16]), 4.0)
    index.add(record(1, [FP16]), 4.5)
    index.add(record(2, [BF16], "compile"), 1.0)  # a swept trial: bf16 is tried under compile now
    index.add(record(2, [BF16], "compile"), 1.0)  # indexed once
    index.add(record(3, [INT8], "compile"), 3.0)
    assert proposed(index, 2) == [(2, "compile_cudagraphs"), (3, "eager"), (3, "compile_cudagraphs")]
    assert index.top(1)[0][1].stages == (BF16.to_dict(),), "the stages of the best trial are swept"
    index.add(record(4, [BF16], "compile_cudagraphs"), 0.8)
    assert proposed(index, 2) == [(3, "eager"), (3, "compile_cudagraphs")]


def test_a_runtime_sweeps_the_fastest_stage_lists_it_can_run() -> None:
    """ONNX Runtime cannot run AMP: its sweep skips the AMP stage lists and takes the next fastest ones."""
    index = RuntimeSweepIndex()
    index.add(record(0, [BF16]), 2.0)
    index.add(record(1, [FP16]), 3.0)
    index.add(record(2, [INT8]), 5.0)
    index.add(record(3, []), 10.0)

    def runnable(stages: tuple[dict[str, object], ...], runtime: str) -> bool:
        return runtime != "onnxruntime" or all(s["stage"] != "amp" for s in stages)

    swept = [(p.number, p.runtime) for p in index.proposals(["eager", "onnxruntime"], 2, runnable)]
    assert swept == [(2, "onnxruntime"), (3, "onnxruntime")]


def test_a_preset_stage_list_is_not_swept_and_leaves_its_place_to_the_next() -> None:
    """A preset names the runtimes where it can pay (static int8 not under eager): the sweep leaves its stage
    list alone, and the next fastest stage lists take its place in the top few."""
    index = RuntimeSweepIndex()
    index.add(record(0, [BF16], "compile"), 1.0, runtimes_chosen=True)
    index.add(record(1, [INT8]), 3.0)
    index.add(record(2, [FP16]), 4.0)
    assert proposed(index, 1) == [(1, "compile"), (1, "compile_cudagraphs")]
    assert index.fastest == 1.0, "a preset still counts as the fastest so far"
    index.add(record(3, [BF16], "eager"), 2.0)  # the same stages from another trial: still the preset's choice
    assert all(p.stages != (BF16.to_dict(),) for p in index.proposals(RUNTIMES, 10))


def dropped(number: int, stages: Sequence[StageConfig], drop: float) -> TrialRecord:
    done = record(number, stages)
    return TrialRecord(number=done.number, state=done.state, runtime=done.runtime, recipe=done.recipe,
                       metrics={"metric_drop": drop})


def test_a_stage_list_a_faster_composition_of_it_dominates_is_not_swept() -> None:
    """``prune`` alone once ``prune + int8`` ran faster with no larger drop: the sweep tries the composition."""
    index = RuntimeSweepIndex()
    index.add(dropped(0, [], 0.0), 10.0)
    index.add(dropped(1, [PRUNE], -2.5), 8.0)
    index.add(dropped(2, [PRUNE, INT8], -2.8), 2.5)
    index.add(dropped(3, [BF16], -0.1), 5.0)
    assert proposed(index, 3) == [(2, "compile"), (2, "compile_cudagraphs"), (3, "compile"),
                                  (3, "compile_cudagraphs")], "bf16 holds no prune: still swept"
    index.add(dropped(4, [PRUNE, INT8, FP16], -1.0), 2.0)  # faster, but a larger drop: both stay
    assert {number for number, _ in proposed(index, 3)} == {2, 3, 4}
