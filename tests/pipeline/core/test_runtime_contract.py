"""One contract over every installed runtime (as Optuna tests every sampler and storage alike), built-in or a
plugin's, and the toy runtime of a separately installed package (``tests/plugins/toy_runtime``, pip-installed by
conftest.py): a new runtime module + its entry-point line is held to it with no new test code, and no runtime is a
special case here: what differs between runtimes is what each declares (its export, what it reproduces)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig
from paretorch.pipeline.core.mirror import ExportMirror, MirrorFacts, Need
from paretorch.pipeline.core.runtimes.base import NoExport, Runtime
from paretorch.pipeline.core.runtimes.registry import (
    available_runtimes,
    get_runtime,
    prepare_runtime,
    registered_runtimes,
)
from paretorch.pipeline.core.runtimes.reproduces import TORCHSCRIPT
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import get_stage
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.runner import Runner

CPU = torch.device("cpu")
TOY_RUNTIME = "inference_mode"
#: Every installed runtime and the toy plugin's (under ``--toy-plugin`` it is installed already).
NAMES = sorted({*registered_runtimes(), TOY_RUNTIME})


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    """Each runtime's name, the toy plugin's registered through its entry point first."""
    if request.param == TOY_RUNTIME:
        request.getfixturevalue("toy_plugins_loaded")
    return str(request.param)


class _Undeclared(MirrorFacts):
    """Facts needing values no runtime declares, on every axis."""

    def needs(self) -> tuple[Need, ...]:
        return (Need("precision", ("float7",), "a float7 recipe"),
                Need("quantization", ("int3 weights, float activations",), "an int3 recipe"))


def test_a_runtime_is_registered_under_its_own_name_and_labelled_by_it(name: str) -> None:
    runtime = get_runtime(name)
    assert isinstance(runtime, Runtime) and runtime.name == name
    assert runtime.label(CPU).startswith(name)
    assert isinstance(runtime.available(CPU), bool) and isinstance(runtime.deploys(), str)


def test_a_declared_export_is_a_registered_export_stage_taking_the_runtime_settings(name: str) -> None:
    declared = get_runtime(name).export
    if declared is None:
        return
    stage = get_stage(declared.stage)
    assert stage.is_export
    assert set(declared.settings) <= set(stage.config_type.model_fields), "settings the export does not take"


def test_what_a_runtime_cannot_run_is_what_it_does_not_declare(name: str) -> None:
    runtime = get_runtime(name)
    declared = runtime.reproduces
    assert runtime.cannot_run(ExportMirror(), scripted=False) is None, "a float recipe runs everywhere"
    scripted = runtime.cannot_run(ExportMirror(), scripted=True)
    takes_torchscript = declared.outputs is None or TORCHSCRIPT in declared.outputs
    assert (scripted is None) == takes_torchscript
    if scripted is not None:
        assert name in scripted and "TorchScript" in scripted
    undeclared = runtime.cannot_run(ExportMirror((_Undeclared(),)), scripted=False)
    if declared.precisions is not None:
        assert undeclared is not None and "a float7 recipe" in undeclared
    if declared.quantization is not None:
        assert undeclared is not None and "an int3 recipe" in undeclared
    if declared.precisions is None and declared.quantization is None:
        assert undeclared is None, "a runtime of the built torch model runs any numerics"


def test_outside_the_engine_only_a_runtime_without_an_export_prepares_a_module(name: str) -> None:
    runtime = get_runtime(name)
    if not runtime.available(CPU):
        return
    if runtime.export is None:
        assert callable(runtime.prepare(nn.Linear(2, 2).eval(), NoExport(name), CPU))
    else:
        with pytest.raises(ConfigError, match="through the Runner"):
            runtime.prepare(nn.Linear(2, 2).eval(), NoExport(name), CPU)


def test_every_runtime_here_runs_the_model_like_eager(name: str, digits_spec: ModelSpec, digits_model: nn.Module,
                                                     tmp_path: Path) -> None:
    if name not in available_runtimes(CPU):
        return
    runner = Runner(recipe_pipeline([]), digits_spec, CPU, cache=NodeCache(export_dir=tmp_path / "exports"),
                    work_dir=tmp_path, model=digits_model)
    fn = runner.prepare({}, name)
    (inputs,) = digits_spec.example_inputs(4)
    with torch.no_grad():
        torch.testing.assert_close(fn(inputs), digits_model.eval()(inputs), atol=1e-4, rtol=1e-4)
    file = runner.runtime_file({}, name)
    assert (file is None) == (get_runtime(name).export is None)


def test_a_runtime_this_device_lacks_is_infeasible_and_an_unknown_one_lists_the_known() -> None:
    missing = [name for name in registered_runtimes() if name not in available_runtimes(CPU)]
    for name in missing:
        with pytest.raises(InfeasibleConfig, match=f"runtime {name} is not available on cpu"):
            prepare_runtime(nn.Linear(2, 2), name, CPU)
    with pytest.raises(ConfigError, match="unknown runtime 'eagre': choose one of eager"):
        get_runtime("eagre")
