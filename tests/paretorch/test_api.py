"""``import paretorch``: its names are the project's own objects, every built-in stage's config among them, loaded
on first use; and the project's packages it claims come from beside it or not at all (issue 34.7)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import paretorch
import paretorch.api
import pipeline.api
from paretorch._home import HOME, PACKAGES, claim
from pipeline.core.stage import registered_stages


def test_every_name_is_the_projects_own_object() -> None:
    assert paretorch.__all__ == paretorch.api.__all__
    for name in paretorch.api.__all__:
        assert getattr(paretorch, name) is getattr(paretorch.api, name), name
    assert paretorch.run_chain is pipeline.api.run_chain and paretorch.StageContext is pipeline.api.StageContext
    assert set(paretorch.__all__) <= set(dir(paretorch))


def test_every_built_in_stage_config_is_a_paretorch_name() -> None:
    built_in = {stage.config_type for stage in registered_stages().values()
                if stage.config_type.__module__.startswith("stages.")}
    assert len(built_in) >= 9  # prune, distill, pack, quantize, amp and the four exports
    handed_out = {getattr(paretorch, name) for name in paretorch.__all__}
    assert built_in <= handed_out, sorted(c.__name__ for c in built_in - handed_out)


def test_an_unknown_name_says_where_the_names_are() -> None:
    with pytest.raises(AttributeError, match=r"'paretorch' has no attribute 'Pruneconfig'.*paretorch.api.__all__"):
        _ = paretorch.Pruneconfig
    with pytest.raises(AttributeError, match="'paretorch' has no attribute '_private'"):
        _ = paretorch._private


def test_the_packages_come_from_beside_paretorch() -> None:
    for name in PACKAGES:
        assert Path(sys.modules[name].__file__ or "").resolve() == (HOME / name / "__init__.py").resolve()


def test_a_package_imported_from_elsewhere_is_an_import_error(tmp_path: Path) -> None:
    """The project's ``pipeline`` is imported (from HOME); claiming from another folder names both places."""
    with pytest.raises(ImportError, match=r"'pipeline' is already imported from .*import paretorch before it"):
        claim(tmp_path)


def test_a_missing_package_is_an_import_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pipeline")
    with pytest.raises(ImportError, match=r"the project's 'pipeline' package is missing from .*reinstall paretorch"):
        claim(tmp_path)
    assert "pipeline" not in sys.modules


def test_a_package_that_fails_to_import_leaves_no_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "__init__.py").write_text("raise RuntimeError('broken install')\n")
    monkeypatch.delitem(sys.modules, "pipeline")
    with pytest.raises(RuntimeError, match="broken install"):
        claim(tmp_path)
    assert "pipeline" not in sys.modules
