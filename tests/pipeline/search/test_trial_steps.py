"""A trial is one declared sequence of steps (:mod:`paretorch.pipeline.search.trial_steps`): the plan reads as rule
out, screen, probe, subset, evaluate, judge; :func:`walk` runs the steps in their order on a frozen state, each
handing the next one what it added, until one returns the trial's outcome; a step that runs the model has its
exceptions turned into the trial's outcome, any other step's are the search's."""

from __future__ import annotations

import dataclasses
import datetime
from functools import partial
from typing import Any

import pytest

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.search.interrupt import Interrupts
from paretorch.pipeline.search.record import COMPLETE, FAIL, PRUNED, TrialOutcome, TrialRecord
from paretorch.pipeline.search.trial_steps import TRIAL_STEPS, Step, TrialState, walk


class FakeTrial:
    """What a step's state holds of an Optuna trial here: its number and start."""

    number = 7
    datetime_start = datetime.datetime(2026, 1, 1)
    user_attrs: dict[str, Any] = {}


def _state() -> TrialState:
    draft = partial(TrialRecord, number=FakeTrial.number, runtime="eager", configs={})
    return TrialState(FakeTrial(), {}, "eager", draft, start=0.0)  # type: ignore[arg-type]


def _adds(name: str) -> Step[list[str]]:
    """A step that records that it ran (with what the steps before it added) and adds its own name."""

    def run(ran: list[str], state: TrialState) -> TrialState:
        ran.append(f"{name} after {sorted(state.configs)}")
        return dataclasses.replace(state, configs={**state.configs, name: None})

    return Step(name, run)


def _ends(name: str) -> Step[list[str]]:
    def run(ran: list[str], state: TrialState) -> TrialOutcome:
        ran.append(f"{name} after {sorted(state.configs)}")
        return TrialOutcome(state.draft(state=COMPLETE), values=(1.0,))

    return Step(name, run)


def _raises(exc: Exception, runs_model: bool) -> Step[list[str]]:
    def run(ran: list[str], state: TrialState) -> TrialState:
        raise exc

    return Step("raises", run, runs_model=runs_model)


def test_the_trials_plan_is_declared_once_in_the_issues_order() -> None:
    assert [step.name for step in TRIAL_STEPS] == ["rule out", "screen", "probe", "subset", "evaluate", "judge"]
    assert [step.name for step in TRIAL_STEPS if step.runs_model] == ["screen", "probe", "subset", "evaluate"], (
        "the steps that run the trial's model are the guarded ones")


def test_the_steps_run_in_their_order_and_an_outcome_stops_the_walk() -> None:
    ran: list[str] = []
    steps = (_adds("rule out"), _adds("screen"), _ends("probe"), _adds("subset"), _ends("judge"))
    outcome = walk(steps, ran, _state(), Interrupts())
    assert ran == ["rule out after []", "screen after ['rule out']", "probe after ['rule out', 'screen']"], (
        "each step sees what the steps before it added; none runs after the one that returned the outcome")
    assert outcome.record.state == COMPLETE and outcome.values == (1.0,)


def test_a_trials_state_is_frozen() -> None:
    state = _state()
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.runtime = "compile"  # type: ignore[misc]
    assert state.pruned(ruled_out="why").record.state == PRUNED


def test_a_step_that_runs_the_model_ends_the_trial_with_its_exception() -> None:
    infeasible = walk((_raises(InfeasibleConfig("no such layer"), True),), [], _state(), Interrupts())
    assert infeasible.record.state == PRUNED and infeasible.record.infeasible == "no such layer"
    error = ValueError("the stage broke")
    failed = walk((_raises(error, True), _ends("judge")), [], _state(), Interrupts())
    assert failed.record.state == FAIL and failed.failure is error
    assert failed.record.error is not None and "ValueError: the stage broke" in failed.record.error


def test_any_other_steps_exception_is_the_searchs() -> None:
    with pytest.raises(ValueError, match="a bug in the search"):
        walk((_raises(ValueError("a bug in the search"), False),), [], _state(), Interrupts())


def test_a_plan_that_ends_without_an_outcome_says_so() -> None:
    with pytest.raises(RuntimeError, match=r"the trial's steps \(rule out, screen\) ended without an outcome"):
        walk((_adds("rule out"), _adds("screen")), [], _state(), Interrupts())
