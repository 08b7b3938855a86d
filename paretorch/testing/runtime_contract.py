"""The runtime contract (:class:`RuntimeContract`): what every runtime, built-in or a plugin's, does. No runtime is
a special case: what differs between runtimes is what each declares (its export, what it reproduces)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch import nn

from paretorch.extend import (
    RUNTIMES_ENTRY_POINT_GROUP,
    TORCHSCRIPT,
    ConfigError,
    ExportMirror,
    InfeasibleConfig,
    MirrorFacts,
    ModelSpec,
    Need,
    NoExport,
    Runtime,
)
from paretorch.pipeline.core.runtimes.registry import prepare_runtime, registered_runtimes
from paretorch.pipeline.core.stage import get_stage
from paretorch.pipeline.engine.cache import NodeCache
from paretorch.pipeline.engine.graph import recipe_pipeline
from paretorch.pipeline.engine.runner import Runner
from paretorch.testing.digits import OnDigits
from paretorch.testing.under_test import under_test

CPU = torch.device("cpu")
#: How close a runtime's outputs are to eager torch's on the float model.
ATOL = RTOL = 1e-4


class _Undeclared(MirrorFacts):
    """Facts needing values no runtime declares, on every axis."""

    def needs(self) -> tuple[Need, ...]:
        return (Need("precision", ("float7",), "a float7 recipe"),
                Need("quantization", ("int3 weights, float activations",), "an int3 recipe"))


class RuntimeContract(OnDigits):
    """The runtime contract as a pytest test class: subclass it in the plugin's tests, naming the runtime (its
    entry-point name), and pytest runs every check on it, on the CPU, over the digits model
    (:class:`~paretorch.testing.digits.OnDigits`: override ``spec`` and ``model`` for another)::

        from paretorch.testing import RuntimeContract

        class TestInferenceMode(RuntimeContract):
            runtime_name = "inference_mode"

    The checks: it is registered under its own name and labelled by it; a declared export is a registered export
    stage taking the runtime's settings; what it refuses to run is exactly what its ``reproduces`` leaves out;
    outside the engine only a runtime without an export prepares a module (one unavailable here is infeasible);
    and, where it runs, the Runner's model under it gives eager torch's outputs (within 1e-4).
    """

    #: The runtime's name: its entry point's in the ``paretorch.runtimes`` group.
    runtime_name: ClassVar[str]

    @pytest.fixture
    def runtime(self) -> Runtime:
        """The runtime ``runtime_name`` names, found through the installed entry points."""
        return under_test(self, "runtime_name", "runtime", registered_runtimes(), RUNTIMES_ENTRY_POINT_GROUP)

    def test_a_runtime_is_registered_under_its_own_name_and_labelled_by_it(self, runtime: Runtime) -> None:
        assert isinstance(runtime, Runtime) and registered_runtimes()[runtime.name] is runtime
        assert runtime.label(CPU).startswith(runtime.name)
        assert isinstance(runtime.available(CPU), bool) and isinstance(runtime.deploys(), str)

    def test_a_declared_export_is_a_registered_export_stage_taking_the_runtime_settings(
        self, runtime: Runtime
    ) -> None:
        declared = runtime.export
        if declared is None:
            return
        stage = get_stage(declared.stage)
        assert stage.is_export
        assert set(declared.settings) <= set(stage.config_type.model_fields), "settings the export does not take"

    def test_what_a_runtime_cannot_run_is_what_it_does_not_declare(self, runtime: Runtime) -> None:
        declared = runtime.reproduces
        assert runtime.cannot_run(ExportMirror(), scripted=False) is None, "a float recipe runs everywhere"
        scripted = runtime.cannot_run(ExportMirror(), scripted=True)
        takes_torchscript = declared.outputs is None or TORCHSCRIPT in declared.outputs
        assert (scripted is None) == takes_torchscript
        if scripted is not None:
            assert runtime.name in scripted and "TorchScript" in scripted
        undeclared = runtime.cannot_run(ExportMirror((_Undeclared(),)), scripted=False)
        if declared.precisions is not None:
            assert undeclared is not None and "a float7 recipe" in undeclared
        if declared.quantization is not None:
            assert undeclared is not None and "an int3 recipe" in undeclared
        if declared.precisions is None and declared.quantization is None:
            assert undeclared is None, "a runtime of the built torch model runs any numerics"

    def test_outside_the_engine_only_a_runtime_without_an_export_prepares_a_module(self, runtime: Runtime) -> None:
        model = nn.Linear(2, 2).eval()
        if not runtime.available(CPU):
            with pytest.raises(InfeasibleConfig, match=f"runtime {runtime.name} is not available on cpu"):
                prepare_runtime(model, runtime.name, CPU)
        elif runtime.export is None:
            assert callable(runtime.prepare(model, NoExport(runtime.name), CPU))
        else:
            with pytest.raises(ConfigError, match="through the Runner"):
                runtime.prepare(model, NoExport(runtime.name), CPU)

    def test_every_runtime_here_runs_the_model_like_eager(self, runtime: Runtime, spec: ModelSpec, model: nn.Module,
                                                         tmp_path: Path) -> None:
        if not runtime.available(CPU):
            pytest.skip("the runtime is not available on this CPU")
        runner = Runner(recipe_pipeline([]), spec, CPU, cache=NodeCache(export_dir=tmp_path / "exports"),
                        work_dir=tmp_path, model=model)
        fn = runner.prepare({}, runtime.name)
        inputs = spec.example_inputs(4)
        with torch.no_grad():
            torch.testing.assert_close(fn(*inputs), model.eval()(*inputs), atol=ATOL, rtol=RTOL)
        file = runner.runtime_file({}, runtime.name)
        assert (file is None) == (runtime.export is None)
