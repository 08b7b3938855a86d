"""One number for one recipe: the search's ``serve`` speed-up (its own paired measurement, StudyLatency), the bench's
end-to-end row (paretorch.experiments.bench.end_to_end) and a timed ``load_deployment(...).encode`` against fp32 run the
same way agree within their intervals.

The model is a toy text encoder whose forward waits a fixed time (the ``toy.wait`` stage halves it), so the three
measurements time a known, stable difference through the real paths: strings through the tokenizer, the model,
outputs to the host."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import optuna
import pytest
import torch
from torch import Tensor, nn

from paretorch.experiments.bench.end_to_end import BASELINE, measure
from paretorch.pipeline.api import StageContext, load_deployment, run_chain
from paretorch.pipeline.core.latency import LATENCY_BUDGETS
from paretorch.pipeline.core.paired import measure_paired
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, registered
from paretorch.pipeline.core.text_batches import ModelEncoder
from paretorch.pipeline.core.timing import DeviceTimer, process_clock
from paretorch.pipeline.core.workload import workload_for
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.deployment import save_deployment
from paretorch.pipeline.engine.graph import EVALUATE_OP, Node, Pipeline
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.engine.runner import Runner
from paretorch.pipeline.search.study_latency import StudyLatency

#: Run alone (make test's serial pass): three measurements of one speed-up must agree within their intervals.
pytestmark = pytest.mark.serial

CPU = torch.device("cpu")
TEXTS = [f"request {i}: " + "token " * (i % 5) for i in range(16)]
BATCH = 4
SETTINGS = LATENCY_BUDGETS["quick"]


class Waiting(nn.Module):
    """(input_ids, attention_mask) -> (batch, 4) embeddings, after waiting ``wait`` seconds a call."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(1, 4)
        self.register_buffer("wait", torch.tensor(0.02))

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        time.sleep(float(self.wait))
        return self.proj((input_ids * attention_mask).sum(1, keepdim=True).float())


class WaitConfig(StageConfig):
    stage = "toy.wait"
    seconds: float = 0.01

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> WaitConfig | None:
        return None


def apply_wait(model: nn.Module, config: WaitConfig, ctx: StageContext) -> nn.Module:
    model.wait.fill_(config.seconds)  # type: ignore[operator]
    return model


def char_tokens(texts: Sequence[str]) -> tuple[Tensor, Tensor]:
    width = max(len(t) for t in texts)
    ids = torch.tensor([[1 + ord(c) % 50 for c in t] + [0] * (width - len(t)) for t in texts])
    return ids, (ids > 0).long()


SPEC = ModelSpec(name="waiting", build=lambda: Waiting().eval(), example_inputs=lambda n: char_tokens((TEXTS * n)[:n]),
                 calibration=list, evaluation=list, metric=None,  # type: ignore[arg-type]  # timed, not scored
                 padding_mask=1, encode_text=char_tokens, latency_texts=lambda: TEXTS)


#: What the three paths may differ by besides their intervals: ``time.sleep`` overshoots its 10-20 ms by a
#: host-dependent fraction of a millisecond, and each path adds its own few microseconds of Python a call. With the
#: other core busy the search read 1.959 [1.950, 1.969] and the bench 1.936 [1.921, 1.947]: 0.2 % apart.
MEASUREMENT_FLOOR = 0.02


def overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two intervals meet, each widened by :data:`MEASUREMENT_FLOOR` of its ends."""
    low, high = 1 - MEASUREMENT_FLOOR, 1 + MEASUREMENT_FLOOR
    return a[0] * low <= b[1] * high and b[0] * low <= a[1] * high


def test_the_search_the_bench_and_a_timed_deployment_give_one_speed_up(tmp_path: Path) -> None:
    recipe = Recipe((WaitConfig(seconds=0.01),), runtime="eager", model=SPEC.name)
    with registered(Stage(WaitConfig, apply_wait)):
        # The search: the study's own paired measurement on its serve workload.
        pipeline = Pipeline([Node("model", "model"), Node("wait", "toy.wait", ("model",)),
                             Node("evaluate", EVALUATE_OP, ("wait",))], name="waiting")
        runner = Runner(pipeline, SPEC, CPU, cache=NodeCache(export_dir=tmp_path / "exports"), latency=SETTINGS,
                        work_dir=tmp_path / "work")
        latency = StudyLatency(SPEC, CPU, BATCH, lambda: runner, SETTINGS, workload_for("serve", SPEC, BATCH))
        searched = latency.pair(latency.function({"wait": WaitConfig(seconds=0.01)}, "eager"), "eager")
        # A deployment as a user gets it, against the unoptimized model behind the same encode.
        save_deployment(run_chain(SPEC.build(), recipe.stages, StageContext(SPEC, CPU)).model, recipe,
                        tmp_path / "deploy")
        deployed = load_deployment(tmp_path / "deploy", SPEC)
    fp32 = ModelEncoder(SPEC.build(), CPU, 1, encode_text=char_tokens)
    stream = latency.workload.texts if latency.workload is not None else ()
    assert len(stream) == 4 * BATCH

    def served(encoder: ModelEncoder) -> tuple[object, tuple[()]]:
        return (lambda: encoder.encode(stream, BATCH, sort=False)), ()

    timed = measure_paired(served(fp32), served(deployed), DeviceTimer(CPU, SETTINGS), SETTINGS,
                           cpu_clock=process_clock)
    bench = measure({BASELINE: lambda texts: fp32.encode(texts, BATCH, sort=False),
                     "deployed": lambda texts: deployed.encode(texts, BATCH, sort=False)},
                    stream, rounds=8, batch=BATCH, log=lambda line: None)["deployed"]
    intervals = {"search": searched.ci, "deployment": timed.ci, "bench": tuple(bench["ci"])}
    speed_ups = {"search": searched.speedup, "deployment": timed.speedup, "bench": bench["speedup"]}
    assert all(value > 1.4 for value in speed_ups.values()), speed_ups  # half the wait: a real difference measured
    for one, other in (("search", "deployment"), ("search", "bench"), ("deployment", "bench")):
        assert overlap(intervals[one], intervals[other]), (speed_ups, intervals)
