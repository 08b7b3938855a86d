"""The README and docs/ stay true to the code: links resolve, Python blocks parse, the make targets
and ``python -m`` commands they show exist, every CLI option is in the command reference, and the
README stays one page."""

from __future__ import annotations

import argparse
import ast
import re
from functools import cache
from pathlib import Path

import pytest

from paretorch.pipeline.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 160

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MAKE = re.compile(r"\bmake\s+([a-z][\w-]*)")
PIPELINE_CMD = re.compile(r"python\s+-m\s+pipeline\s+([^\s`|]+)")
MODULE_CMD = re.compile(r"python\s+-m\s+((?:pipeline|experiments)\.[\w.]+)")


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def _code(text: str) -> list[str]:
    """Fenced blocks and inline code spans: where commands are shown (prose may say "make" freely)."""
    blocks = [body for _, body in FENCE.findall(text)]
    prose = FENCE.sub("", text)
    return blocks + INLINE_CODE.findall(prose)


@cache
def _make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.MULTILINE))


@cache
def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("paretorch.pipeline.cli.main.build_parser() has no subcommands")


def test_readme_is_one_page() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"
    assert "make test" in README.read_text()


def test_docs_pages_exist_and_are_linked_from_the_readme() -> None:
    assert DOCS, "docs/ has no pages"
    targets = {(README.parent / link.split("#")[0]).resolve() for link in LINK.findall(README.read_text())}
    index = ROOT / "docs" / "index.md"
    if index.exists():
        targets |= {(index.parent / link.split("#")[0]).resolve() for link in LINK.findall(index.read_text())}
    unlinked = [str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in targets and p != index]
    assert not unlinked, f"docs pages not linked from README.md or docs/index.md: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for link in LINK.findall(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("#"):
            continue  # http(s):, mailto:, or an anchor in the same page
        target = (page.parent / link.split("#")[0]).resolve()
        if not target.exists():
            broken.append(link)
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_python_blocks_parse(page: Path) -> None:
    for lang, body in FENCE.findall(page.read_text()):
        if lang in ("python", "py"):
            try:
                ast.parse(body)
            except SyntaxError as err:
                pytest.fail(f"{page.relative_to(ROOT)}: a python block does not parse: {err}\n{body}")


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_make_targets_exist(page: Path) -> None:
    named = {t for snippet in _code(page.read_text()) for t in MAKE.findall(snippet)}
    missing = sorted(named - _make_targets())
    assert not missing, f"{page.relative_to(ROOT)}: make targets not in the Makefile: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_pipeline_commands_exist(page: Path) -> None:
    text = page.read_text()
    commands = set(_subparsers())
    shown = set(PIPELINE_CMD.findall(text))
    unknown = sorted(c for c in shown if c not in commands and c != "<command>")
    assert not unknown, f"{page.relative_to(ROOT)}: `python -m paretorch` commands that do not exist: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_python_modules_exist(page: Path) -> None:
    missing = []
    for module in MODULE_CMD.findall(page.read_text()):
        path = ROOT.joinpath(*module.rstrip(".").split("."))
        if not (path.with_suffix(".py").exists() or (path / "__main__.py").exists()):
            missing.append(module)
    assert not missing, f"{page.relative_to(ROOT)}: `python -m` modules that do not exist: {missing}"


def test_cli_reference_names_every_option() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    missing = []
    for name, sub in _subparsers().items():
        assert f"python -m paretorch {name}" in text, f"docs/cli.md has no section for `{name}`"
        for action in sub._actions:
            if action.help == argparse.SUPPRESS:
                continue  # internal (e.g. --worker-index, set by the parent process)
            longs = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
            if longs and not any(re.search(rf"`{re.escape(o)}[ `=]", text) for o in longs):
                missing.append(f"{name} {longs[0]}")
    assert not missing, f"docs/cli.md does not name these options: {missing}"
