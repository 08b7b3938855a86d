"""A trial is timed with the function its own run prepared and measured, never one prepared for another recipe:
the prepared function is a value of the run's result (no runner state), and a run whose evaluation came from the
cache has none, so its own recipe is prepared again (the ``toy.tag`` stage labels each recipe's model)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path

import torch

from paretorch.pipeline.core.latency import LatencySettings
from paretorch.pipeline.core.paired import Timed
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, config_from_dict, registered
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.graph import EVALUATE_OP, Node, Pipeline
from paretorch.pipeline.engine.run_result import RunResult
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.search.study_latency import StudyLatency

CPU = torch.device("cpu")
FAST = LatencySettings(warmup_runs=1, min_runs=3, min_seconds=0, rounds=4, round_runs=1)


class LabelTimer:
    """Times nothing: records the label of every model a round timed (None: the unlabelled baseline)."""

    def __init__(self) -> None:
        self.timed: set[str | None] = set()

    def warm_up(self, sides: Sequence[Timed]) -> None:
        pass

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        self.timed.update(getattr(inspect.unwrap(fn), "paretorch_label", None) for fn, _ in sides)
        return [1.0 for _ in sides]


def test_a_trial_is_timed_with_its_own_runs_function_never_another_recipes(
        residual_spec: ModelSpec, tag_stage: Stage, tmp_path: Path) -> None:
    with registered(tag_stage):
        pipeline = Pipeline([Node("model", "model"), Node("tag", "toy.tag", ("model",)),
                             Node("evaluate", EVALUATE_OP, ("tag",))], name="tagged")
        runner = Runner(pipeline, residual_spec, CPU, cache=NodeCache(export_dir=tmp_path / "exports"),
                        latency=FAST, work_dir=tmp_path / "work")
        latency = StudyLatency(residual_spec, CPU, 8, lambda: runner, FAST)
        latency.cpu_clock = None

        def measured_labels(result: RunResult) -> set[str | None]:
            latency.timer = timer = LabelTimer()
            latency.measure(result)
            return timer.timed

        a_configs = {"tag": config_from_dict({"stage": "toy.tag", "label": "a"})}
        a = runner.run(a_configs)
        b = runner.run({"tag": config_from_dict({"stage": "toy.tag", "label": "b"})})
        assert a.prepared is not None and b.prepared is not None and a.prepared is not b.prepared
        assert a.configs == a_configs
        # b was prepared last; a is still timed with a's own function
        assert latency.measured(a) is a.prepared and measured_labels(a) == {None, "a"}

        again = runner.run(a_configs)  # the evaluation is a cache hit: nothing was prepared in this run
        assert again.objective.cached and again.prepared is None
        fn = latency.measured(again)
        assert fn is not b.prepared and getattr(inspect.unwrap(fn), "paretorch_label", None) == "a"
        assert measured_labels(again) == {None, "a"}
