"""One contract over every installed runtime (as Optuna tests every sampler and storage alike), built-in or a
plugin's, and the toy runtime of a separately installed package (``tests/plugins/toy_runtime``, pip-installed by
conftest.py): :class:`paretorch.testing.RuntimeContract`, the class a plugin's own tests subclass. A new runtime
module + its entry-point line is held to it with no new test code, and no runtime is a special case here."""

from __future__ import annotations

import pytest

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.runtimes.base import Runtime
from paretorch.pipeline.core.runtimes.registry import get_runtime, registered_runtimes
from paretorch.testing import RuntimeContract

TOY_RUNTIME = "inference_mode"
#: Every installed runtime and the toy plugin's (under ``--toy-plugin`` it is installed already).
NAMES = sorted({*registered_runtimes(), TOY_RUNTIME})


class TestEveryRuntime(RuntimeContract):
    """The contract over each runtime, the toy plugin's registered through its entry point first."""

    @pytest.fixture(params=NAMES)
    def runtime(self, request: pytest.FixtureRequest) -> Runtime:
        if request.param == TOY_RUNTIME:
            request.getfixturevalue("toy_plugins_loaded")
        return get_runtime(str(request.param))


def test_an_unknown_runtime_lists_the_known() -> None:
    with pytest.raises(ConfigError, match="unknown runtime 'eagre': choose one of eager"):
        get_runtime("eagre")
