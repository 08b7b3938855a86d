"""Compositions before the runtime sweep: once the seeds ran, the combination of the measured winners is the next
trial, and the sweep of the single stage lists under the other runtimes waits for it (on the MiniLM CPU search
the sweep of the first seeds ran first and put ``prune depth + int8s | ov`` at trial 18)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
import pytest
import torch
from torch import Tensor, nn

from paretorch.pipeline.core.paired import Timed
from paretorch.pipeline.core.runtimes.base import ExportHandle, Runtime
from paretorch.pipeline.core.runtimes.registry import registered_runtime
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, registered
from paretorch.pipeline.search import SearchConfig
from paretorch.pipeline.search.compose import COMPOSED_PREFIX
from paretorch.pipeline.search.objectives import ATTR_SEED
from tests.pipeline.search.conftest import run_on_fake_clock


class ShrinkConfig(StageConfig):
    """Marks the model as shrunk (a structural change, for a fake clock) and leaves its numbers as they are."""

    stage = "toy.shrink"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> ShrinkConfig | None:
        return None


def apply_shrink(model: nn.Module, config: ShrinkConfig, ctx: StageContext) -> nn.Module:
    model.paretorch_shrunk = True  # type: ignore[assignment]
    return model


class Plain(Runtime):
    """A second runtime, as fast as eager on the fake clock: something for the sweep to propose."""

    name = "toy_plain"

    def available(self, device: torch.device) -> bool:
        return True

    def prepare(self, model: nn.Module, export: ExportHandle, device: torch.device) -> Callable[..., Tensor]:
        def run(*inputs: Tensor) -> Tensor:
            return model(*inputs)

        run.paretorch_model = model  # type: ignore[attr-defined]
        return run


class GainTimer:
    """1 ms, halved by the ``fast`` tag, divided by 1.5 by the shrink."""

    def warm_up(self, sides: Sequence[Timed]) -> None:
        pass

    def __call__(self, sides: Sequence[Timed]) -> list[float]:
        times = []
        for fn, _ in sides:
            model = getattr(inspect.unwrap(fn), "paretorch_model", inspect.unwrap(fn))
            fast = getattr(model, "paretorch_label", None) == "fast"
            times.append(1.0 / (2.0 if fast else 1.0) / (1.5 if getattr(model, "paretorch_shrunk", False) else 1.0))
        return times


def test_the_composition_of_the_winners_runs_before_the_sweep(residual_spec: ModelSpec, tag_stage: Stage,
                                                            tmp_path: Path) -> None:
    pipeline_file = tmp_path / "two-axes.yaml"
    pipeline_file.write_text("nodes:\n  - {op: model}\n  - {op: toy.shrink}\n  - {op: toy.tag}\n"
                             "  - {name: evaluate, op: evaluate}\n")
    seeds = [{"name": "fast", "stages": [{"stage": "toy.tag", "label": "fast"}]},
             {"name": "shrink", "stages": [{"stage": "toy.shrink"}]}]
    with registered(tag_stage), registered(Stage(ShrinkConfig, apply_shrink)), registered_runtime(Plain()):
        config = SearchConfig.load(None, pipeline=str(pipeline_file), sampler="random",
                                   runtimes=("eager", "toy_plain"), latency_budget="quick", exports="none",
                                   seeds=seeds, presets=())
        search = run_on_fake_clock(residual_spec, config, tmp_path, GainTimer(), trials=5)
    trials = search.outcome.study.trials  # type: ignore[attr-defined]
    seeds_run = [t.user_attrs.get(ATTR_SEED, "") for t in trials]
    assert seeds_run[1:3] == ["fast", "shrink"], seeds_run
    assert seeds_run[3].startswith(COMPOSED_PREFIX), f"the composition comes first: {seeds_run}"
    assert trials[3].user_attrs["paretorch.metrics"]["speedup"] == pytest.approx(3.0)
    assert seeds_run[4].startswith("runtime-sweep-of-trial-"), f"then the sweep: {seeds_run}"


class _Step:
    """One proposal source of :class:`Proposals`: records its call, enqueues ``count``."""

    def __init__(self, calls: list[str], name: str, count: int) -> None:
        self.calls, self.name, self.count = calls, name, count

    def __call__(self, study: object, unoptimized: bool = True) -> int:
        self.calls.append(self.name if unoptimized else f"{self.name} (optimized lists)")
        return self.count


@pytest.mark.parametrize(("enqueued", "expected"), [
    ({"compose": 1}, ["compose"]),
    ({"sweep": 1}, ["compose", "sweep (optimized lists)"]),
    ({"later": 2}, ["compose", "sweep (optimized lists)", "later"]),
    ({}, ["compose", "sweep (optimized lists)", "later", "sweep"]),
])
def test_the_held_back_seeds_come_before_the_unoptimized_models_sweep(enqueued: dict[str, int],
                                                                      expected: list[str]) -> None:
    """Once nothing waits: compositions, the sweep of the measured stage lists, the held-back seeds (the fp32 and
    undecided reduced-precision presets), and only then the unoptimized model's list under the other runtimes."""
    from paretorch.pipeline.search.proposals import Proposals

    calls: list[str] = []
    proposals = object.__new__(Proposals)
    proposals.compose = _Step(calls, "compose", enqueued.get("compose", 0))  # type: ignore[method-assign]
    proposals.sweep = _Step(calls, "sweep", enqueued.get("sweep", 0))  # type: ignore[method-assign]
    proposals.release_later = _Step(calls, "later", enqueued.get("later", 0))  # type: ignore[method-assign]
    proposals.feasible_latency = lambda record: None  # type: ignore[method-assign]
    proposals.sweep_index = lambda study: type("Index", (), {"add": lambda *a: None})()  # type: ignore[method-assign]
    proposals.gains = lambda study: type("Gains", (), {"add": lambda *a: None})()  # type: ignore[method-assign]
    study = type("Study", (), {"get_trials": lambda self, **kw: []})()
    proposals(study, None, type("Record", (), {"seed": None})())  # type: ignore[arg-type]
    assert calls == expected
