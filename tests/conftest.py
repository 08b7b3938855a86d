"""Shared fixtures: a private results directory, the digits spec and model, a residual MLP spec,
the default pipeline's stages as the registry places them, and ``--toy-plugin``.

``--toy-plugin`` installs ``tests/stages/toy_plugin`` (a third-party stage with an ``order`` that a
search samples: on/off and an integer) and ``tests/plugins/toy_runtime`` (a third-party runtime), each
one module plus one entry-point line, with pip into a temporary folder for the whole run, as a user's
``pip install`` would, so that the run proves plugins cannot turn the suite red (``make test`` runs the
contract, default-pipeline and search tests this way). ``plugin_installer`` pip-installs any plugin package the
same way (tests/plugins/test_out_of_tree.py: a plugin's contract tests run outside this checkout).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch._dynamo.config
import torch._inductor.config
from torch import Tensor, nn

from paretorch.pipeline.core.device import CPU_BF16_ENV_VAR, capabilities
from paretorch.pipeline.core.paths import RESULTS_ENV_VAR
from paretorch.pipeline.core.runtimes import registry as runtime_registry
from paretorch.pipeline.core.spec import ACCURACY, ModelSpec
from paretorch.pipeline.core.stage import load_entry_points, registered_stages, unregister_stage

#: Process-wide compiler settings that runtimes change (``freezing``, the recompile limit): restored after each test.
#: Imported here (about 1 s), so that every test starts from their defaults, whichever test imported them first.
COMPILER_CONFIGS = (torch._dynamo.config, torch._inductor.config)
#: The seed of Python's and torch's global generators at the start of every test.
TEST_SEED = 0
TOY_PLUGIN_SOURCES = (Path(__file__).parent / "stages" / "toy_plugin",
                      Path(__file__).parent / "plugins" / "toy_runtime")
TOY_STAGE = "toy.scale_bias"
TOY_RUNTIME = "inference_mode"
TEST_WEIGHTS_ENV_VAR = "PARETORCH_TEST_WEIGHTS"
#: What a plugin source folder may hold from an earlier build or editable install: never copied.
BUILD_LEFTOVERS = shutil.ignore_patterns("*.egg-info", "__pycache__", "build")
_TOY_SITE: list[Path] = []  # the folder --toy-plugin installed into, while the run lasts


def install_plugins(sources: Iterable[Path], folder: Path) -> Path:
    """pip-install copies of the plugin packages ``sources`` (offline, no build isolation, no dependencies) into
    ``folder``/site, as a user's ``pip install`` would (their entry points with them); returns the site."""
    site = folder / "site"
    builds = []
    for source in sources:
        build = folder / "src" / source.name
        shutil.copytree(source, build, dirs_exist_ok=True, ignore=BUILD_LEFTOVERS)
        builds.append(str(build))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
         "--no-compile", "--target", str(site), *builds],
        check=True, capture_output=True, text=True, timeout=180,
    )
    return site


def install_toy_plugin(folder: Path) -> Path:
    """pip-install the toy stage and toy runtime packages into ``folder``/site; returns the site."""
    return install_plugins(TOY_PLUGIN_SOURCES, folder)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--toy-plugin", action="store_true",
                     help="install the toy stage and toy runtime plugins (tests/stages/toy_plugin, "
                          "tests/plugins/toy_runtime) for the whole run")
    parser.addoption("--shuffle", type=int, default=None, metavar="SEED",
                     help="run the test modules, and the tests in each, in an order shuffled with SEED (make "
                     "test-shuffled): an order dependence fails, and the same SEED repeats the order")


def shuffled(items: list[pytest.Item], seed: int) -> list[pytest.Item]:
    """``items`` with their modules in a seeded random order, and the tests of each module shuffled too (a
    module's tests stay together, so its module-scoped fixtures are built once)."""
    generator = random.Random(seed)
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(str(item.path), []).append(item)
    order = list(modules.values())
    generator.shuffle(order)
    for tests in order:
        generator.shuffle(tests)
    return [item for tests in order for item in tests]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if (seed := config.getoption("--shuffle")) is not None:
        items[:] = shuffled(items, seed)


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The order the run used (under ``-q`` too, where the header is not shown): what repeats a failure."""
    if (seed := config.getoption("--shuffle")) is not None:
        terminalreporter.write_line(f"shuffled order: --shuffle {seed} (make test-shuffled SEED={seed} repeats it)")


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"toy plugin installed: {TOY_STAGE}, {TOY_RUNTIME} ({_TOY_SITE[0]})"] if _TOY_SITE else []
    if (seed := config.getoption("--shuffle")) is not None:
        lines.append(f"shuffled order: --shuffle {seed} (the same seed repeats it)")
    return lines


@pytest.fixture(scope="session")
def toy_plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the toy stage and runtime packages are installed: the ``--toy-plugin`` site, or a fresh one."""
    if _TOY_SITE:
        return _TOY_SITE[0] / "site"
    return install_toy_plugin(tmp_path_factory.mktemp("toy_plugin"))


@pytest.fixture(scope="session")
def plugin_installer() -> Callable[[Iterable[Path], Path], Path]:
    """:func:`install_plugins`: ``plugin_installer(sources, folder)`` pip-installs plugin packages into a site."""
    return install_plugins


@pytest.fixture(scope="module")
def toy_plugins_loaded(toy_plugin_site: Path) -> Iterator[None]:
    """The toy stage and toy runtime, registered through their entry points (as a user's installed package would
    be) for one test module, and both removed after it (one package site holds both, so loading either entry
    point group can register the other's plugin too). Under ``--toy-plugin`` they stay for the whole run."""
    if _TOY_SITE:
        yield
        return
    sys.path.insert(0, str(toy_plugin_site))
    importlib.invalidate_caches()
    try:
        load_entry_points()
        runtime_registry.load_entry_points()
        yield
    finally:
        unregister_stage(TOY_STAGE)
        runtime_registry.unregister_runtime(TOY_RUNTIME)
        sys.path.remove(str(toy_plugin_site))
        for module in ("toy_paretorch_stage", "toy_paretorch_runtime"):
            sys.modules.pop(module, None)


def default_stage_names() -> tuple[list[str], list[str]]:
    """The default pipeline as the registry places it, written here independently of
    ``paretorch.pipeline.core.stage.default_order``: stages with an ``order``, sorted by (order, name),
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


@pytest.fixture(autouse=True)
def same_global_state() -> Iterator[None]:
    """Every test starts from the same process-wide state, whatever ran before it (the suite passes in any order):

    * the environment (``main([... "--results-dir", X])`` points every later test at X);
    * torch's thread count (``optimize`` without ``--threads`` picks one from the machine's load);
    * Python's and torch's global random generators, seeded;
    * dynamo's compiled code and the dynamo and inductor settings (``freezing``, the recompile limit);
    * Ctrl-C: Python's own SIGINT handler, as in a terminal. A suite started in the background (``make test &``,
      ``nohup``) inherits SIGINT ignored, and the Ctrl-C tests (in this process, or in subprocesses, which inherit
      it) then saw no Ctrl-C at all (in one shuffled order; in another some earlier test had installed a handler)."""
    environ = dict(os.environ)
    sigint = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threads = torch.get_num_threads()
    configs = [config.get_config_copy() for config in COMPILER_CONFIGS]
    random.seed(TEST_SEED)
    torch.manual_seed(TEST_SEED)
    yield
    for key in set(os.environ) - set(environ):
        del os.environ[key]
    os.environ.update(environ)
    torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, sigint)
    torch._dynamo.reset()
    for config, saved in zip(COMPILER_CONFIGS, configs, strict=True):
        changed = {key: value for key, value in saved.items() if getattr(config, key) != value}
        if changed:
            config.load_config(changed)


@pytest.fixture(scope="session")
def digits_spec(results_dir: Path) -> ModelSpec:
    from paretorch.experiments.models.digits import spec

    return spec()


@pytest.fixture(scope="session")
def pristine_digits_model(digits_spec: ModelSpec) -> nn.Module:
    """The trained digits CNN, trained once per session (then cached): never handed to a test."""
    from paretorch.pipeline.core.spec import load_model

    return load_model(digits_spec)


@pytest.fixture(scope="session")
def pristine_digits_fingerprint(pristine_digits_model: nn.Module) -> tuple[object, ...]:
    return model_fingerprint(pristine_digits_model)


@pytest.fixture(scope="module")
def digits_model(pristine_digits_model: nn.Module) -> nn.Module:
    """The trained digits CNN: one copy per test module, so that no module sees what another did. Do not mutate
    it: a test (or a module fixture) that does fails (:func:`digits_model_unchanged`)."""
    return copy.deepcopy(pristine_digits_model)


def model_fingerprint(model: nn.Module) -> tuple[object, ...]:
    """What a stage could change in place: the module tree, train/eval flags, hooks, and every tensor's bytes."""
    modules = tuple((name, type(m).__name__, m.training, len(m._forward_hooks), len(m._forward_pre_hooks))
                    for name, m in model.named_modules())
    tensors = []
    for name, tensor in model.state_dict().items():
        digest = hashlib.sha1(usedforsecurity=False)
        try:
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        except (RuntimeError, TypeError):  # a quantized or subclassed tensor: its type and shape tell the change
            digest.update(repr(type(tensor)).encode())
        tensors.append((name, str(tensor.dtype), tuple(tensor.shape), tensor.requires_grad, digest.hexdigest()))
    return modules, tuple(tensors)


@pytest.fixture(autouse=True)
def digits_model_unchanged(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that uses ``digits_model`` leaves it as trained (its module's next tests share it)."""
    if "digits_model" not in request.fixturenames:
        yield
        return
    model = request.getfixturevalue("digits_model")
    pristine = request.getfixturevalue("pristine_digits_model")
    expected = request.getfixturevalue("pristine_digits_fingerprint")
    yield
    if model_fingerprint(model) != expected:
        model.__dict__.clear()  # restored in place, for the module's next tests
        model.__dict__.update(copy.deepcopy(pristine).__dict__)
        pytest.fail(f"{request.node.nodeid} (or a fixture it uses) changed the shared digits_model in place: "
                    "copy.deepcopy it first")


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
