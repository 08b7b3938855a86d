"""The bench says which instruction set a row ran on, and labels rows measured under an emulated AVX2 cap."""

from __future__ import annotations

import pytest

from paretorch.experiments.bench.isa import ISA_CAPS, isa_info


def test_a_row_without_caps_is_not_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    info = isa_info()
    assert info["emulated"] is None and info["caps"] == {}
    assert "not_reached" not in info


def test_an_avx2_cap_labels_the_row_and_names_what_it_does_not_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    info = isa_info()
    assert info["emulated"] == "avx2"
    assert info["caps"] == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert any("OpenVINO" in part for part in info["reaches"]), "oneDNN's cap reaches OpenVINO's oneDNN nodes"
    assert any("ONNX Runtime" in part for part in info["not_reached"])
