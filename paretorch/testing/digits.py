"""The model the contracts run a plugin on: the built-in digits CNN (scikit-learn's bundled 8x8 handwritten
digits, nothing downloaded), trained once and cached under the results directory (``PARETORCH_RESULTS_DIR``,
default ``runs/``: a minute or more of CPU the first time, a file read afterwards)."""

from __future__ import annotations

import pytest
from torch import nn

from paretorch.experiments.models.digits import spec as digits_spec
from paretorch.pipeline.core.spec import ModelSpec, load_model


class OnDigits:
    """The ``spec`` and ``model`` fixtures of a contract (one per test class). A plugin whose stage or runtime
    needs another kind of model overrides both in its subclass (``spec`` returning its own
    :class:`~paretorch.extend.ModelSpec`, ``model`` its trained model)."""

    @pytest.fixture(scope="class")
    def spec(self) -> ModelSpec:
        """The digits spec."""
        return digits_spec()

    @pytest.fixture(scope="class")
    def model(self, spec: ModelSpec) -> nn.Module:
        """The trained model of ``spec``, shared by the class's tests: each test changes only its own copy."""
        return load_model(spec)
