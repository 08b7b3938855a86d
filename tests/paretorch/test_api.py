"""``import paretorch``: its names are the project's own objects, every built-in stage's config among them, loaded
on first use (issue 34.7); the one import root's version (issue 45.1)."""

from __future__ import annotations

import pytest

import paretorch
import paretorch.api
import paretorch.pipeline.api
from paretorch.pipeline.core.stage import registered_stages


def test_every_name_is_the_projects_own_object() -> None:
    assert paretorch.__all__ == paretorch.api.__all__
    for name in paretorch.api.__all__:
        assert getattr(paretorch, name) is getattr(paretorch.api, name), name
    assert paretorch.run_chain is paretorch.pipeline.api.run_chain
    assert paretorch.StageContext is paretorch.pipeline.api.StageContext
    assert set(paretorch.__all__) <= set(dir(paretorch))


def test_every_built_in_stage_config_is_a_paretorch_name() -> None:
    built_in = {stage.config_type for stage in registered_stages().values()
                if stage.config_type.__module__.startswith("paretorch.stages.")}
    assert len(built_in) >= 9  # prune, distill, pack, quantize, amp and the four exports
    handed_out = {getattr(paretorch, name) for name in paretorch.__all__}
    assert built_in <= handed_out, sorted(c.__name__ for c in built_in - handed_out)


def test_an_unknown_name_says_where_the_names_are() -> None:
    with pytest.raises(AttributeError, match=r"'paretorch' has no attribute 'Pruneconfig'.*paretorch.api.__all__"):
        _ = paretorch.Pruneconfig
    with pytest.raises(AttributeError, match="'paretorch' has no attribute '_private'"):
        _ = paretorch._private


def test_the_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version

    assert paretorch.__version__ == version("paretorch")
