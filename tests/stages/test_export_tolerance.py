"""An export's check against torch (paretorch.stages.export.checks): a broken float export is always infeasible; a lossy
one below the cosine floor is infeasible for a spec judged by fidelity, and only noted for one judged by labels
(--eval-data), whose labelled metric and allowed drop decide."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.fidelity import MEAN_COSINE
from paretorch.pipeline.core.spec import ACCURACY, ModelSpec
from paretorch.stages.export.checks import compare_outputs, judged_by_labels, require_close


def spec(metric: object) -> ModelSpec:
    return ModelSpec(name="m", build=lambda: torch.nn.Identity(), example_inputs=lambda b: (torch.zeros(b, 2),),
                     calibration=list, evaluation=list, metric=metric)  # type: ignore[arg-type]


REFERENCE = [torch.tensor([[1.0, 0.0, 0.5], [0.2, 1.0, 0.0]])]
FAR = [torch.tensor([[0.6, 0.7, 0.1], [0.7, 0.3, 0.4]])]  # cosine about 0.7 to the reference


def test_a_lossy_export_below_the_floor_is_infeasible_when_fidelity_judges() -> None:
    comparison = compare_outputs(REFERENCE, FAR)
    assert comparison.cosine < 0.95
    unlabelled = spec(MEAN_COSINE)
    assert not judged_by_labels(unlabelled)
    with pytest.raises(InfeasibleConfig, match="beyond tolerance"):
        require_close(comparison, lossy=True, what="onnxruntime (CPU)", spec=unlabelled)


def test_labels_judge_a_lossy_export_the_floor_only_notes_it() -> None:
    labelled = spec(ACCURACY)
    assert judged_by_labels(labelled)
    note = require_close(compare_outputs(REFERENCE, FAR), lossy=True, what="onnxruntime (CPU)", spec=labelled)
    assert note.startswith("onnxruntime (CPU) is below the lossy export's cosine floor")
    assert "not ruled out, the labelled metric (accuracy) and the allowed drop judge it" in note
    with pytest.raises(InfeasibleConfig):  # a float export that differs is a broken conversion, labels or not
        require_close(compare_outputs(REFERENCE, FAR), lossy=False, what="onnxruntime (CPU)", spec=labelled)


def test_a_close_export_matches() -> None:
    close = [t + 1e-6 for t in REFERENCE]
    assert require_close(compare_outputs(REFERENCE, close), lossy=False, what="x").startswith("x matches torch")
    assert dataclasses.is_dataclass(compare_outputs(REFERENCE, close))
