"""The per-trial console line: the short recipe, whole words at 80-120 columns, one line in a log file."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import config_from_dict
from paretorch.pipeline.engine.recipe import Recipe
from paretorch.pipeline.search.objectives import Objectives
from paretorch.pipeline.search.record import TrialRecord
from paretorch.pipeline.search.trial_log import TrialLogger

STAGES = ({"stage": "prune", "ratio": 0.3}, {"stage": "distill", "max_seconds": 300},
          {"stage": "quantize", "method": "int8_static_pt2e"}, {"stage": "export.onnx"})


def record() -> TrialRecord:
    recipe = Recipe(stages=tuple(config_from_dict(dict(s)) for s in STAGES), runtime="onnxruntime", model="m")
    metrics = {"accuracy": 0.9861, "metric_drop": 0.0028, "speedup": 5.08, "speedup_ci_low": 4.73,
               "speedup_ci_high": 5.18}
    return TrialRecord(number=16, state="COMPLETE", runtime="onnxruntime", recipe=recipe, metrics=metrics,
                       seconds={"trial": 12.34}, cache={"hits": 2}, seed="prune-0.3-distill")


def logger(spec: ModelSpec, console: Console) -> TrialLogger:
    config = SimpleNamespace(exports="pareto", sampler="tpe")
    search = SimpleNamespace(device=torch.device("cpu"), spec=spec, config=config,
                             objectives=Objectives.create(spec, ["metric", "latency"], "1%", 8))
    return TrialLogger(search, None, console)  # type: ignore[arg-type]


def shown(spec: ModelSpec, console: Console) -> str:
    logger(spec, console).show(record())
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_a_log_file_gets_the_whole_line_with_the_short_recipe(residual_spec: ModelSpec) -> None:
    text = shown(residual_spec, Console(file=io.StringIO(), width=80))
    assert text == ("trial  16 COMPLETE accuracy 0.9861 (drop +0.0028) | 5.08x [4.73, 5.18] paired | "
                    "prune 0.3 + distill 200 + int8s | ort [12.3 s, cache 2 hit(s)] <- prune-0.3-distill\n")


@pytest.mark.parametrize("width", [80, 100, 120])
def test_a_terminal_wraps_the_line_between_words(residual_spec: ModelSpec, width: int) -> None:
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    text = shown(residual_spec, console)
    whole = shown(residual_spec, Console(file=io.StringIO(), width=width))
    assert len(text.splitlines()) > 1 or width >= len(whole)
    assert all(len(line) <= width for line in text.splitlines())
    assert text.split() == whole.split(), "every word whole, in order"


def test_an_infeasible_or_failed_trial_names_the_recipe_it_tried(residual_spec: ModelSpec) -> None:
    """Not only "infeasible: ...": the recipe it asked for (trial 11 was distill alone), then the cause."""
    distill = config_from_dict({"stage": "distill", "max_seconds": 300})
    for state, fields, cause in (("PRUNED", {"infeasible": "distill: nothing to recover"},
                                  "| infeasible: distill: nothing to recover"),
                                 ("FAIL", {"error": "Traceback\nRuntimeError: boom"}, "| RuntimeError: boom")):
        console = Console(file=io.StringIO(), width=200)
        logger(residual_spec, console).show(TrialRecord(number=11, state=state, runtime="eager",
                                                        configs={"prune": None, "distill": distill}, **fields))
        line = console.file.getvalue()  # type: ignore[attr-defined]
        assert line.startswith(f"trial  11 {state:8s} distill 200 | eager {cause}"), line


def test_a_trials_run_is_written_under_the_study_lock(residual_spec: ModelSpec) -> None:
    """Another process's catch-up logs, under the same lock, a finished trial no process logged: the trial's own
    write holds the lock too, so one of the two sees the other's run and one child run is written."""
    import contextlib

    held: list[bool] = [False]
    written: list[tuple[int, bool]] = []

    @contextlib.contextmanager
    def lock():  # type: ignore[no-untyped-def]
        held[0] = True
        try:
            yield
        finally:
            held[0] = False

    tracker = SimpleNamespace(log_trial=lambda number, *args, **kwargs: written.append((number, held[0])))
    base = logger(residual_spec, Console(file=io.StringIO()))
    locked = TrialLogger(base.parts, tracker, base.console, lock)  # type: ignore[arg-type]
    locked.log(record())
    locked.write(record())  # the catch-up's call: its caller holds the lock
    assert written == [(16, True), (16, False)]
