"""One contract over every registered runtime (as Optuna tests every sampler and storage alike): a new
runtime module + its registry line is held to it with no new test code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline.core.errors import ConfigError, InfeasibleConfig
from pipeline.core.mirror import ExportMirror
from pipeline.core.runtimes.base import FileRuntime, Runtime
from pipeline.core.runtimes.registry import RUNTIMES, available_runtimes, get_runtime, prepare_runtime
from pipeline.core.spec import ModelSpec
from pipeline.core.stage import get_stage
from pipeline.engine.cache import NodeCache
from pipeline.engine.graph import recipe_pipeline
from pipeline.engine.runner import Runner

CPU = torch.device("cpu")
NAMES = sorted(RUNTIMES)


@pytest.mark.parametrize("name", NAMES)
def test_a_runtime_is_registered_under_its_own_name_and_labelled_by_it(name: str) -> None:
    runtime = get_runtime(name)
    assert isinstance(runtime, Runtime) and runtime.name == name
    assert runtime.label(CPU).startswith(name)
    assert isinstance(runtime.available(CPU), bool) and isinstance(runtime.deploys(), str)


@pytest.mark.parametrize("name", NAMES)
def test_a_file_runtime_names_a_registered_export_stage_and_settings_that_stage_has(name: str) -> None:
    runtime = get_runtime(name)
    if runtime.file is None:
        assert not isinstance(runtime, FileRuntime)
        return
    assert isinstance(runtime, FileRuntime)
    stage = get_stage(runtime.file.export_stage)
    assert stage.is_export
    assert set(runtime.file.settings) <= set(stage.config_type.model_fields), "settings the export does not take"
    # a file runtime never wraps a torch module: the runner makes and opens its file
    with pytest.raises(ValueError, match="runs an exported file"):
        runtime.prepare(nn.Linear(2, 2), CPU)


@pytest.mark.parametrize("name", NAMES)
def test_what_a_runtime_cannot_run_is_known_before_any_stage_runs(name: str) -> None:
    runtime = get_runtime(name)
    assert runtime.cannot_run(ExportMirror(), scripted=False) is None, "a float recipe runs everywhere"
    scripted = runtime.cannot_run(ExportMirror(), scripted=True)
    if name == "eager":
        assert scripted is None
    else:  # compiled and exported runtimes trace the module: TorchScript is ruled out, with the runtime named
        assert scripted is not None and name in scripted


@pytest.mark.parametrize("name", [n for n in NAMES if n in available_runtimes(CPU)])
def test_every_runtime_here_runs_the_model_like_eager(name: str, digits_spec: ModelSpec, digits_model: nn.Module,
                                                     tmp_path: Path) -> None:
    runner = Runner(recipe_pipeline([]), digits_spec, CPU, cache=NodeCache(export_dir=tmp_path / "exports"),
                    work_dir=tmp_path, model=digits_model)
    fn = runner.prepare({}, name)
    (inputs,) = digits_spec.example_inputs(4)
    with torch.no_grad():
        torch.testing.assert_close(fn(inputs), digits_model.eval()(inputs), atol=1e-4, rtol=1e-4)


def test_a_runtime_this_device_lacks_is_infeasible_and_an_unknown_one_lists_the_known() -> None:
    missing = [name for name in NAMES if name not in available_runtimes(CPU)]
    for name in missing:
        with pytest.raises(InfeasibleConfig, match=f"runtime {name} is not available on cpu"):
            prepare_runtime(nn.Linear(2, 2), name, CPU)
    with pytest.raises(ConfigError, match="unknown runtime 'eagre': choose one of eager"):
        get_runtime("eagre")
