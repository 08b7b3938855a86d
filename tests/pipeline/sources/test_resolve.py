"""Spec resolution: every bad-input case gives one clear SpecError."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch
from torch import nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.names import MODEL_ENTRY_POINT_GROUP, builtin_names, model_entry_points
from paretorch.pipeline.core.spec import ACCURACY, ModelSpec, load_model
from paretorch.pipeline.sources.resolve import resolve_spec

GOOD_SPEC_FILE = '''
import torch
from torch import nn
from paretorch.pipeline.core.spec import ACCURACY, ModelSpec

def _build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3))

x = torch.randn(8, 4)
spec = ModelSpec(
    name="tiny", build=_build, example_inputs=lambda b: (torch.randn(b, 4),),
    calibration=lambda: [(x,)], evaluation=lambda: [((x,), torch.zeros(8, dtype=torch.long))],
    metric=ACCURACY,
)
def make_spec():
    return spec
not_a_spec = 42
def needs_args(a):
    return spec
def returns_wrong():
    return "nope"
'''


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_model.py"
    path.write_text(GOOD_SPEC_FILE)
    return path


def _tiny_spec(build, forward_inputs=None) -> ModelSpec:
    return ModelSpec(
        name="broken",
        build=build,
        example_inputs=forward_inputs or (lambda b: (torch.randn(b, 4),)),
        calibration=list,
        evaluation=list,
        metric=ACCURACY,
    )


def test_builtin_names_include_digits() -> None:
    assert "digits" in builtin_names()


def test_builtin_models_are_declared_as_entry_points() -> None:
    declared = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=MODEL_ENTRY_POINT_GROUP)}
    assert {"digits", "minilm"} <= set(declared)
    assert declared["digits"] == "paretorch.experiments.models.digits:spec"


@pytest.mark.parametrize("name", sorted(model_entry_points()))
def test_every_model_entry_point_loads_to_its_named_spec(name: str) -> None:
    """Each registered name resolves to a ModelSpec (not built: no weights are loaded) named after it."""
    spec = resolve_spec(name)
    assert isinstance(spec, ModelSpec)
    assert spec.name == name and spec.source == name


def test_a_model_entry_point_that_fails_to_load_is_one_spec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = importlib.metadata.EntryPoint("broken", "no_such_module_here:spec", MODEL_ENTRY_POINT_GROUP)
    for module in ("paretorch.pipeline.core.user_files", "paretorch.pipeline.sources.resolve"):  # checked, loaded
        monkeypatch.setattr(f"{module}.model_entry_points", lambda: {"broken": broken})
    with pytest.raises(SpecError, match=r"model entry point 'broken' \(no_such_module_here:spec\) failed to load: "
                                        "ModuleNotFoundError"):
        resolve_spec("broken")


def test_builtin_resolves() -> None:
    spec = resolve_spec("digits")
    assert spec.name == "digits" and spec.metric.name == "accuracy"


def test_file_attr_spec_and_callable(spec_file: Path) -> None:
    assert resolve_spec(f"{spec_file}:spec").name == "tiny"
    assert resolve_spec(f"{spec_file}:make_spec").name == "tiny"


def test_module_attr() -> None:
    assert resolve_spec("paretorch.experiments.models.digits:spec").name == "digits"


def test_unknown_name_lists_builtins() -> None:
    with pytest.raises(SpecError, match=r"unknown model 'nosuch'.*digits"):
        resolve_spec("nosuch")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="model file not found"):
        resolve_spec(f"{tmp_path}/absent.py:spec")


def test_file_without_attr_part(spec_file: Path) -> None:
    with pytest.raises(SpecError, match="names a file but no attribute"):
        resolve_spec(str(spec_file))


def test_import_error_is_quoted(tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text("raise RuntimeError('weights missing on disk')\n")
    with pytest.raises(SpecError, match=r"importing .*bad.py failed: RuntimeError: weights missing on disk"):
        resolve_spec(f"{path}:spec")


def test_missing_attribute(spec_file: Path) -> None:
    with pytest.raises(SpecError, match="has no attribute 'nope'"):
        resolve_spec(f"{spec_file}:nope")


def test_wrong_type_attribute(spec_file: Path) -> None:
    with pytest.raises(SpecError, match="is a int, not a ModelSpec"):
        resolve_spec(f"{spec_file}:not_a_spec")


def test_callable_with_arguments(spec_file: Path) -> None:
    with pytest.raises(SpecError, match="must take no arguments"):
        resolve_spec(f"{spec_file}:needs_args")


def test_callable_returning_wrong_type(spec_file: Path) -> None:
    with pytest.raises(SpecError, match="returned a str, not a ModelSpec"):
        resolve_spec(f"{spec_file}:returns_wrong")


def test_missing_module() -> None:
    with pytest.raises(SpecError, match=r"module 'no_such_pkg\.models' not found"):
        resolve_spec("no_such_pkg.models:spec")


def test_build_raises() -> None:
    def build() -> nn.Module:
        raise FileNotFoundError("checkpoint.pt")

    with pytest.raises(SpecError, match=r"building model 'broken' failed: FileNotFoundError: checkpoint\.pt"):
        load_model(_tiny_spec(build))


def test_build_returns_non_module() -> None:
    with pytest.raises(SpecError, match=r"build\(\) returned a dict, not a torch\.nn\.Module"):
        load_model(_tiny_spec(lambda: {"weights": 1}))


def test_forward_raises() -> None:
    spec = _tiny_spec(lambda: nn.Linear(4, 3), lambda b: (torch.randn(b, 5),))
    with pytest.raises(SpecError, match="forward on example inputs failed: RuntimeError"):
        load_model(spec)


def test_forward_returns_tuple() -> None:
    class TwoOutputs(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x

    with pytest.raises(SpecError, match="forward returned tuple; it must return one tensor"):
        load_model(_tiny_spec(TwoOutputs))


def test_forward_returns_nan() -> None:
    class NaNModel(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * float("nan")

    with pytest.raises(SpecError, match="NaN or inf"):
        load_model(_tiny_spec(NaNModel))


def test_load_model_is_in_eval_mode(spec_file: Path) -> None:
    model = load_model(resolve_spec(f"{spec_file}:spec"))
    assert not model.training
