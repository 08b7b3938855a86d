"""The export cache key covers every converter's version and the installed plugins': an upgrade of any of them
never serves a file the old version made."""

from __future__ import annotations

from importlib import metadata

import pytest

from paretorch.pipeline.engine import cache


@pytest.mark.parametrize("library", ["openvino", "nncf", "transformers", "mlx", "onnxruntime", "coremltools"])
def test_each_converter_version_is_in_the_key(library: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = cache.node_key("export.openvino", {"quantize": "mirror"}, ("parent",), "cpu")
    real = metadata.version

    def upgraded(name: str) -> str:
        return "999.0" if name == library else real(name)

    cache.library_versions.cache_clear()
    monkeypatch.setattr(cache.metadata, "version", upgraded)
    try:
        assert cache.node_key("export.openvino", {"quantize": "mirror"}, ("parent",), "cpu") != before
    finally:
        monkeypatch.undo()
        cache.library_versions.cache_clear()


def test_the_distributions_that_provide_stages_and_runtimes_are_keyed() -> None:
    versions = cache.library_versions()
    assert versions.get("paretorch") == metadata.version("paretorch"), "the project's own stages and runtimes"
