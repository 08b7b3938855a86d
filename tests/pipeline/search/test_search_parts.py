"""``Search`` is split into the study's plan, its store and its model, and nothing receives the search through a
closure: :class:`~paretorch.pipeline.search.proposals.Proposals` takes typed ports (no callable), no ``lambda`` in
the search package captures a ``search``, and no method of :class:`~paretorch.pipeline.search.study.Search` is handed
on bound (``search.enqueue``, ``self.enqueue``)."""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Callable
from pathlib import Path

from paretorch.pipeline.search.objectives import Baseline
from paretorch.pipeline.search.plan import StudyPlan
from paretorch.pipeline.search.proposals import Measured, Proposals, SeedQueue
from paretorch.pipeline.search.study import Search

SEARCH = Path(__file__).resolve().parents[3] / "pipeline" / "search"


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _methods(cls: type) -> set[str]:
    return {name for name, member in vars(cls).items() if inspect.isfunction(member) and not name.startswith("__")}


def _handed_on(tree: ast.AST, holder: str, methods: set[str]) -> list[str]:
    """``holder.<method>`` or a lambda that captures ``holder``, given as an argument of a call."""
    found = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            bound = isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == holder
            if bound and arg.attr in methods:  # type: ignore[union-attr]
                found.append(f"line {arg.lineno}: {ast.unparse(arg)}")
            if isinstance(arg, ast.Lambda) and holder in _names(arg.body):
                found.append(f"line {arg.lineno}: {ast.unparse(arg)}")
    return found


def test_proposals_takes_typed_ports_and_no_callable() -> None:
    hints = typing.get_type_hints(Proposals.__init__)
    hints.pop("return")
    assert hints == {"plan": StudyPlan, "baseline": Baseline, "queue": SeedQueue, "known": Measured}
    assert all(typing.get_origin(hint) is not Callable for hint in hints.values())
    assert all(getattr(port, "_is_protocol", False) for port in (SeedQueue, Measured)), "ports are protocols"


def test_nothing_receives_a_lambda_over_search_or_a_bound_method_of_it() -> None:
    methods = _methods(Search)
    assert {"prepare", "ensure_baseline", "seeder"} <= methods
    found = {}
    for path in sorted(SEARCH.glob("*.py")):
        tree = ast.parse(path.read_text())
        hits = _handed_on(tree, "search", methods)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Search"):
            hits += _handed_on(cls, "self", methods)
        if hits:
            found[path.name] = hits
    assert not found, f"the search handed on through a closure or a bound method: {found}"


def test_the_scan_sees_a_bound_method_and_a_lambda_over_search() -> None:
    """The scan above finds what it forbids (so its silence means something)."""
    code = "Proposals(plan, search.enqueue, runs=lambda c: search.model.rules.reason(c))"
    assert len(_handed_on(ast.parse(code), "search", {"enqueue"})) == 2


def test_the_loop_reads_the_plan_the_store_and_the_model_not_the_searchs_members() -> None:
    tree = ast.parse((SEARCH / "loop.py").read_text())
    read = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "search"}
    assert read <= {"plan", "store", "model", "prepare", "seeder"}, read
