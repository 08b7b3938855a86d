"""Ctrl-C exits in seconds whatever it interrupts, and a resumed study names the trial it runs again and why.

A SIGINT that lands inside a statement on the Optuna storage (here: injected right after a query of the trials
ran, its rows not yet read, as a real one arrives when the query returns) used to leave the query's cursor open
in the traceback's frames, and SQLite's lock with it: the next write (the trial marked FAIL) waited out the
storage's 60 s busy timeout, then failed. The run is a real ``optimize`` in its own process (a hang is what this
checks), its exit bounded generously."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from torch import nn

from paretorch.pipeline.cli.main import main
from paretorch.pipeline.core.stage import Stage, StageConfig, StageContext, registered
from paretorch.pipeline.search.objectives import ATTR_CONFIGS, ATTR_RUNTIME
from paretorch.pipeline.search.storage import ATTR_WORKER
from tests.pipeline.search.test_interrupt import SPEC_SOURCE

#: The exit after the interrupt, at most (it takes about a second; the bug took the 60 s busy timeout and more).
EXIT_BOUND_S = 30.0
#: Set by the stage, cleared by the first query of the storage after it: where the SIGINT lands.
ARMED: list[bool] = []


class ArmConfig(StageConfig):
    """A stage that arms the interrupt: the next query of the storage is cut short by SIGINT."""

    stage = "toy.arm"

    @classmethod
    def suggest(cls, trial: optuna.Trial, ctx: StageContext) -> ArmConfig | None:
        return None


def apply_arm(model: nn.Module, config: ArmConfig, ctx: StageContext) -> nn.Module:
    ARMED.append(True)
    return model


ARM_STAGE = Stage(ArmConfig, apply_arm)


def interrupt_inside_a_query(marker: Path) -> None:
    """From now on, the first query of the trials after the stage ran is followed, inside SQLAlchemy's execute (the
    statement ran, its cursor open), by SIGINT; ``marker`` gets the time it was sent."""

    @event.listens_for(Engine, "after_cursor_execute")
    def interrupt(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if ARMED and statement.lstrip().upper().startswith("SELECT") and "FROM trials" in statement:
            ARMED.clear()
            marker.write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGINT)


def child(argv: list[str]) -> int:
    """The interrupted process: the interrupt injected (its time to ``argv[0]``), the stage registered, then
    ``optimize argv[1:]``."""
    interrupt_inside_a_query(Path(argv[0]))
    with registered(ARM_STAGE):
        return main(argv[1:])


CHILD = "import sys; from tests.pipeline.search.test_interrupt_exit import child; sys.exit(child(sys.argv[1:]))"


@pytest.fixture()
def arm_stage() -> Iterator[None]:
    with registered(ARM_STAGE):
        yield


def optimize_args(folder: Path, trials: int) -> list[str]:
    (folder / "tiny.py").write_text(SPEC_SOURCE)
    (folder / "pipeline.yaml").write_text("nodes:\n  - {op: model}\n  - {op: toy.arm}\n"
                                          "  - {name: evaluate, op: evaluate}\n")
    (folder / "search.yaml").write_text("runtimes: [eager]\nlatency_budget: quick\nexports: none\nsampler: random\n"
                                        "seeds:\n  - {name: armed, stages: [{stage: toy.arm}]}\n")
    return ["optimize", "--model", f"{folder / 'tiny.py'}:spec", "--device", "cpu", "--search-config",
            str(folder / "search.yaml"), "--pipeline", str(folder / "pipeline.yaml"), "--storage",
            f"sqlite:///{folder / 'optuna.db'}", "--study-name", "exit", "--no-tracking", "--trials", str(trials),
            "--threads", "1"]


def test_ctrl_c_inside_a_storage_query_exits_in_seconds_and_the_trial_is_named_on_resume(
        arm_stage: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "sigint-sent"
    args = optimize_args(tmp_path, 3)
    run = subprocess.run([sys.executable, "-c", CHILD, str(marker), *args], capture_output=True, text=True,
                           timeout=240, cwd=Path(__file__).parents[3])
    exited = time.time()
    output = run.stdout + run.stderr
    assert marker.exists(), output
    assert run.returncode == 130, output
    assert exited - float(marker.read_text()) < EXIT_BOUND_S, output
    assert "database is locked" not in output and "StorageInternalError" not in output, output

    assert main(args) == 0  # resumed here, not interrupted: the trial runs again and says so first
    assert "resuming: trial 1 (toy.arm | eager) is run again: it was interrupted (Ctrl-C)" in capsys.readouterr().out


def test_a_trial_left_running_by_a_dead_process_is_named_on_resume(
        arm_stage: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = optimize_args(tmp_path, 1)
    assert main(args) == 0  # the baseline
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process
    study = optuna.load_study(study_name="exit", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    killed = study.ask()  # the seed, RUNNING, as a process that is killed -9 mid-trial leaves it
    killed.set_user_attr(ATTR_WORKER, f"{socket.gethostname()}:{dead.pid}")
    killed.set_user_attr(ATTR_CONFIGS, {"toy.arm": {"stage": "toy.arm"}})
    killed.set_user_attr(ATTR_RUNTIME, "eager")
    capsys.readouterr()

    assert main(optimize_args(tmp_path, 2)) == 0
    output = capsys.readouterr().out
    line = f"resuming: trial {killed.number} (toy.arm | eager) is run again: its process died (left RUNNING)"
    assert line in output, output
    states = {t.number: t.state.name for t in study.get_trials(deepcopy=False)}
    assert states[killed.number] == "FAIL" and list(states.values()).count("COMPLETE") == 2
