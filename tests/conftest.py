"""Shared fixtures: a private results directory, the digits spec and model, a residual MLP spec."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from pipeline.core.device import CPU_BF16_ENV_VAR, capabilities
from pipeline.core.paths import RESULTS_ENV_VAR
from pipeline.core.spec import ACCURACY, ModelSpec


@pytest.fixture(scope="session", autouse=True)
def cpu_bf16_fast() -> Iterator[None]:
    """The CPU's capability row says bf16 is fast, as on the hosts these tests were written on:
    what a test expects of AMP on the CPU must not depend on the host's measured bf16 speed
    (the probe itself is tested in tests/pipeline/core/test_device.py)."""
    old = os.environ.get(CPU_BF16_ENV_VAR)
    os.environ[CPU_BF16_ENV_VAR] = "fast"
    capabilities.cache_clear()
    yield
    if old is None:
        os.environ.pop(CPU_BF16_ENV_VAR, None)
    else:
        os.environ[CPU_BF16_ENV_VAR] = old


@pytest.fixture(scope="session", autouse=True)
def results_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test writes under one temporary results directory (trained weights cached there)."""
    path = tmp_path_factory.mktemp("results")
    old = os.environ.get(RESULTS_ENV_VAR)
    os.environ[RESULTS_ENV_VAR] = str(path)
    yield path
    if old is None:
        os.environ.pop(RESULTS_ENV_VAR, None)
    else:
        os.environ[RESULTS_ENV_VAR] = old


@pytest.fixture(scope="session")
def digits_spec(results_dir: Path) -> ModelSpec:
    from experiments.models.digits import spec

    return spec()


@pytest.fixture(scope="session")
def digits_model(digits_spec: ModelSpec) -> nn.Module:
    """The trained digits CNN (trained once per session, then cached). Do not mutate."""
    from pipeline.core.spec import load_model

    return load_model(digits_spec)


class ResidualMLP(nn.Module):
    """x + f(x) blocks: the shape where naive structured pruning breaks the forward pass."""

    def __init__(self, features: int = 32, hidden: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.stem = nn.Linear(16, features)
        self.block1 = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, features))
        self.block2 = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, features))
        self.head = nn.Linear(features, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.stem(x))
        x = x + self.block1(x)
        x = x + self.block2(x)
        return self.head(x)


def _residual_data() -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(512, 16, generator=generator)
    labels = (inputs[:, :4].sum(dim=1) > 0).long() + 2 * (inputs[:, 4:8].sum(dim=1) > 0).long()
    return inputs, labels


def _trained_residual_mlp() -> nn.Module:
    torch.manual_seed(0)
    model = ResidualMLP()
    inputs, labels = _residual_data()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs[:384]), labels[:384]).backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="session")
def residual_spec() -> ModelSpec:
    """A small trained residual MLP on synthetic 4-class data (train / calibration / evaluation disjoint)."""
    inputs, labels = _residual_data()
    model = _trained_residual_mlp()
    return ModelSpec(
        name="residual_mlp",
        build=lambda: model,
        example_inputs=lambda batch: (inputs[384 : 384 + batch].clone(),),
        calibration=lambda: [(inputs[384:448],)],
        evaluation=lambda: [((inputs[448:],), labels[448:])],
        metric=ACCURACY,
        latency_batch_sizes=(1, 8),
        training=lambda: [((inputs[:384],), labels[:384])],
        loss=nn.functional.cross_entropy,
    )
