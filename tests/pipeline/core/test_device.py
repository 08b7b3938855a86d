"""Device selection and the capability table on this (CPU-only) machine."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import paretorch.pipeline.core.device as device_module
from paretorch.pipeline.core.device import (
    available_kinds,
    capabilities,
    move_module,
    on_device,
    peak_memory_bytes,
    reset_peak_memory,
    resolve_device,
)
from paretorch.pipeline.core.errors import DeviceError, InfeasibleConfig


def test_auto_picks_first_available_in_order() -> None:
    expected = "mps" if torch.backends.mps.is_available() else "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


def test_cpu_is_always_available() -> None:
    assert "cpu" in available_kinds()
    assert resolve_device("CPU").type == "cpu"


@pytest.mark.parametrize("kind", ["cuda", "mps"])
def test_absent_device_is_a_clear_error(kind: str) -> None:
    if kind in available_kinds():
        assert resolve_device(kind).type == kind
        return
    with pytest.raises(DeviceError, match=f"device '{kind}' is not available here .*use --device auto"):
        resolve_device(kind)


def test_unknown_device_name() -> None:
    with pytest.raises(DeviceError, match="unknown device 'tpu': choose one of auto, mps, cuda, cpu"):
        resolve_device("tpu")


def test_cpu_capabilities_match_stack_facts() -> None:
    caps = capabilities(torch.device("cpu"))
    assert torch.float16 in caps.reduced_dtypes and torch.float16 not in caps.fast_dtypes
    assert caps.cuda_graphs is False
    assert caps.cuda_capability is None
    with pytest.raises(InfeasibleConfig, match=r"torch\.float64 is not supported on cpu"):
        caps.require_dtype(torch.float64)


@pytest.mark.parametrize(("supported", "ratio", "fast"), [(True, 0.4, True), (True, 1.7, False), (False, 0.4, False)])
def test_cpu_bf16_is_fast_only_where_measured_faster(monkeypatch: pytest.MonkeyPatch, supported: bool, ratio: float,
                                                     fast: bool, tmp_path: Path) -> None:
    monkeypatch.delenv(device_module.CPU_BF16_ENV_VAR)
    monkeypatch.setattr(device_module, "host_facts_file", lambda: tmp_path / "host-facts.json")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: supported)
    monkeypatch.setattr(device_module, "autocast_time_ratio", lambda dtype: ratio)
    assert device_module.cpu_bf16_is_fast() is fast


def test_the_bf16_verdict_is_kept_per_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Measured once, then read back: a later run (or a later probe under load) does not decide again."""
    monkeypatch.delenv(device_module.CPU_BF16_ENV_VAR)
    monkeypatch.setattr(device_module, "host_facts_file", lambda: tmp_path / "host-facts.json")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    probes: list[float] = []

    def probe(dtype: torch.dtype) -> float:
        probes.append(0.5 if not probes else 2.0)  # fast the first time, slow under load later
        return probes[-1]

    monkeypatch.setattr(device_module, "autocast_time_ratio", probe)
    assert device_module.cpu_bf16_is_fast() is True
    assert device_module.cpu_bf16_is_fast() is True and len(probes) == 1
    facts = json.loads((tmp_path / "host-facts.json").read_text())
    assert list(facts.values()) == [{"cpu_bf16_fast": True}]
    assert next(iter(facts)).endswith(f"| torch {torch.__version__}")
    monkeypatch.setenv(device_module.CPU_BF16_ENV_VAR, "slow")
    assert device_module.cpu_bf16_is_fast() is False, "the environment still overrides the kept verdict"


def test_the_environment_overrides_the_probe_or_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_module, "autocast_time_ratio", lambda dtype: 0.4)
    monkeypatch.setenv(device_module.CPU_BF16_ENV_VAR, "slow")
    assert device_module.cpu_bf16_is_fast() is False
    monkeypatch.setenv(device_module.CPU_BF16_ENV_VAR, "quick")
    with pytest.raises(DeviceError, match=r"PARETORCH_CPU_BF16=quick: set it to fast or slow, or unset it"):
        device_module.cpu_bf16_is_fast()


def test_the_autocast_probe_measures_a_ratio() -> None:
    ratio = device_module.autocast_time_ratio(torch.bfloat16, features=64, rows=16, repeats=2)
    assert 0.0 < ratio < float("inf")


def test_peak_memory_sees_a_large_allocation() -> None:
    device = torch.device("cpu")
    reset_peak_memory(device)
    before = peak_memory_bytes(device)
    # 256 MiB, touched: after a long suite the process holds freed pages that a smaller block may partly reuse
    # (a 64 MiB block raised the peak by only 32 MiB at 1.9 GB resident, late in a full run).
    block = torch.ones(256 * 1024 * 1024 // 4)
    after = peak_memory_bytes(device)
    assert after - before >= 128 * 1024 * 1024
    del block


def test_move_module_skips_a_no_op_move_of_weakly_referenced_subclass_weights() -> None:
    # A torchao-quantized model that torch.compile has seen holds weak references to its
    # weights; Module.to would try to swap them even on the same device, and fail.
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = nn.Sequential(nn.Linear(64, 64))
    quantize_(model, Int8WeightOnlyConfig())
    held = weakref.ref(model[0].weight)
    with pytest.raises(RuntimeError, match="swap"):
        model.to("cpu")  # what move_module avoids
    assert move_module(model, torch.device("cpu")) is model
    assert held() is model[0].weight


def test_move_module_moves_when_a_tensor_is_elsewhere() -> None:
    meta = torch.device("meta")  # the one other device every machine has
    moved = move_module(nn.Linear(2, 2), meta)
    assert on_device(moved.weight, meta) and not on_device(moved.weight, torch.device("cpu"))
