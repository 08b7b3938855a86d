"""Shared fixtures: a private results directory, the digits spec and model, a residual MLP spec,
the default pipeline's stages as the registry places them, and ``--toy-plugin``.

``--toy-plugin`` installs ``tests/stages/toy_plugin`` (a third-party stage with an ``order`` that a
search samples: on/off and an integer) and ``tests/plugins/toy_runtime`` (a third-party runtime), each
one module plus one entry-point line, with pip into a temporary folder for the whole run, as a user's
``pip install`` would, so that the run proves plugins cannot turn the suite red (``make test`` runs the
contract, default-pipeline and search tests this way).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from pipeline.core.device import CPU_BF16_ENV_VAR, capabilities
from pipeline.core.paths import RESULTS_ENV_VAR
from pipeline.core.runtimes import registry as runtime_registry
from pipeline.core.spec import ACCURACY, ModelSpec
from pipeline.core.stage import load_entry_points, registered_stages

TOY_PLUGIN_SOURCES = (Path(__file__).parent / "stages" / "toy_plugin",
                      Path(__file__).parent / "plugins" / "toy_runtime")
TOY_STAGE = "toy.scale_bias"
TOY_RUNTIME = "inference_mode"
TEST_WEIGHTS_ENV_VAR = "PARETORCH_TEST_WEIGHTS"
_TOY_SITE: list[Path] = []  # the folder --toy-plugin installed into, while the run lasts


def install_toy_plugin(folder: Path) -> Path:
    """pip-install the toy stage and toy runtime packages (offline, no build isolation) into ``folder``/site;
    returns the site."""
    site = folder / "site"
    builds = []
    for source in TOY_PLUGIN_SOURCES:
        build = folder / "src" / source.name
        shutil.copytree(source, build, dirs_exist_ok=True)
        builds.append(str(build))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
         "--no-compile", "--target", str(site), *builds],
        check=True, capture_output=True, text=True, timeout=180,
    )
    return site


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--toy-plugin", action="store_true",
                     help="install the toy stage and toy runtime plugins (tests/stages/toy_plugin, "
                          "tests/plugins/toy_runtime) for the whole run")


def pytest_configure(config: pytest.Config) -> None:
    """Under ``--toy-plugin``: install the toy stage and runtime before collection, found through their entry
    points here and in every subprocess a test starts (``PYTHONPATH``)."""
    if not config.getoption("--toy-plugin"):
        return
    folder = Path(tempfile.mkdtemp(prefix="paretorch-toy-plugin-"))
    site = install_toy_plugin(folder)
    _TOY_SITE.append(folder)
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    importlib.invalidate_caches()
    load_entry_points()
    runtime_registry.load_entry_points()
    assert TOY_STAGE in registered_stages(), "the toy plugin's entry point was not found"
    assert TOY_RUNTIME in runtime_registry.registered_runtimes(), "the toy runtime's entry point was not found"


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _TOY_SITE:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> str | None:
    return f"toy plugin installed: {TOY_STAGE}, {TOY_RUNTIME} ({_TOY_SITE[0]})" if _TOY_SITE else None


@pytest.fixture(scope="session")
def toy_plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the toy stage and runtime packages are installed: the ``--toy-plugin`` site, or a fresh one."""
    if _TOY_SITE:
        return _TOY_SITE[0] / "site"
    return install_toy_plugin(tmp_path_factory.mktemp("toy_plugin"))


def default_stage_names() -> tuple[list[str], list[str]]:
    """The default pipeline as the registry places it, written here independently of
    ``pipeline.core.stage.default_order``: stages with an ``order``, sorted by (order, name),
    model stages first, then exports. Every registered stage counts, a plugin's included."""
    placed = sorted((s for s in registered_stages().values() if s.order is not None), key=lambda s: (s.order, s.name))
    return [s.name for s in placed if not s.is_export], [s.name for s in placed if s.is_export]


@pytest.fixture
def default_stages() -> tuple[list[str], list[str]]:
    """(model stages, exports) of the default pipeline, read from the registry (see :func:`default_stage_names`)."""
    return default_stage_names()


@pytest.fixture
def stages_except() -> Callable[..., tuple[str, ...]]:
    """``stages_except("prune", ...)``: every other model stage of the default pipeline (a plugin's included),
    for a search config's ``disabled``: a test names the stages it searches, not the ones it leaves out."""

    def others(*kept: str) -> tuple[str, ...]:
        model_stages, _ = default_stage_names()
        return tuple(name for name in model_stages if name not in kept)

    return others


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
    """Every test writes under one temporary results directory (trained weights cached there).

    ``PARETORCH_TEST_WEIGHTS`` (a folder of cached weights, set by the suite's toy-plugin run for
    the pytest it starts) is copied in first, so that the inner run trains nothing again."""
    path = tmp_path_factory.mktemp("results")
    if os.environ.get(TEST_WEIGHTS_ENV_VAR):
        shutil.copytree(os.environ[TEST_WEIGHTS_ENV_VAR], path / "cache" / "weights")
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
