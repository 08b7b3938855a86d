"""Ctrl-C always stops: a SIGINT that a third-party tracer turns into another exception (or swallows) ends
the run with one "interrupted" line and exit 130, and never becomes a trial's reason."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from torch import nn

from paretorch.pipeline.cli.main import main
from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, registered
from paretorch.pipeline.search.objectives import ATTR_INFEASIBLE, ATTR_REASON, ATTR_SEED

SPEC_SOURCE = '''
import torch
from torch import nn

from paretorch.pipeline.core.fidelity import fidelity_spec

DATA = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))


def spec():
    return fidelity_spec("tiny", lambda: nn.Linear(8, 4).eval(), lambda b: (DATA[:b],), lambda: [(DATA[:16],)],
                         lambda: [(DATA[16:48],)], latency_batch_sizes=(4,))
'''
TRACER_REASON = "could not build the dependency graph"


class TracerConfig(StageConfig):
    """A stage whose third-party tracer catches everything, as torch-pruning's dependency graph may."""

    stage = "toy.tracer"
    swallow: bool = False

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> TracerConfig | None:
        return None


def apply_tracer(model: nn.Module, config: TracerConfig, ctx: StageContext) -> nn.Module:
    try:
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the tracer runs
            time.sleep(30)  # the signal ends the sleep at once
        except BaseException as exc:  # the tracer's broad except
            if config.swallow:
                return model  # ... which may even go on as if nothing happened
            raise TypeError("conv2d() received an invalid combination of arguments") from exc
    except Exception as exc:  # the stage wraps the tracer's failure as an infeasibility
        raise InfeasibleConfig(f"torch-pruning {TRACER_REASON}: {type(exc).__name__}: {exc}") from exc
    return model


@pytest.fixture(scope="module")
def tracer_stage() -> Iterator[None]:
    with registered(Stage(TracerConfig, apply_tracer)):
        yield


@pytest.mark.parametrize("swallow", [False, True], ids=["turned-into-TypeError", "swallowed"])
def test_ctrl_c_inside_a_tracer_stops_the_run(tracer_stage: None, tmp_path: Path, swallow: bool,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tiny.py").write_text(SPEC_SOURCE)
    (tmp_path / "pipeline.yaml").write_text("nodes:\n  - {op: model}\n  - {op: toy.tracer}\n"
                                            "  - {name: evaluate, op: evaluate}\n")
    (tmp_path / "search.yaml").write_text(
        f"runtimes: [eager]\nlatency_budget: quick\nexports: none\nsampler: random\n"
        f"seeds:\n  - {{name: tracer, stages: [{{stage: toy.tracer, swallow: {str(swallow).lower()}}}]}}\n")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    code = main(["optimize", "--model", f"{tmp_path / 'tiny.py'}:spec", "--device", "cpu", "--search-config",
                 str(tmp_path / "search.yaml"), "--pipeline", str(tmp_path / "pipeline.yaml"), "--storage", storage,
                 "--study-name", "ctrl-c", "--no-tracking", "--trials", "3", "--threads", "1"])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 130, output
    assert sum(line.startswith("interrupted") for line in output.splitlines()) == 1, output
    assert TRACER_REASON not in output and "Traceback" not in output, output

    trials = optuna.load_study(study_name="ctrl-c", storage=storage).get_trials(deepcopy=False)
    tracer = [t for t in trials if t.user_attrs.get(ATTR_SEED) == "tracer"]
    assert [t.state.name for t in trials[:2]] == ["COMPLETE", "FAIL"], "the baseline ran, then the interrupted trial"
    assert tracer[0].number == 1 and tracer[-1].state.name == "WAITING", "the interrupted config runs again next time"
    for trial in trials:
        assert ATTR_INFEASIBLE not in trial.user_attrs and TRACER_REASON not in trial.user_attrs.get(ATTR_REASON, "")
