"""The digits spec: real data, disjoint splits, trained once, accurate."""

from __future__ import annotations

import torch
from torch import nn

from paretorch.experiments.models import digits
from paretorch.pipeline.core.evaluate import compute_metric
from paretorch.pipeline.core.spec import ModelSpec


def test_splits_never_overlap() -> None:
    splits = digits._splits()
    seen: set[bytes] = set()
    sizes = 0
    for images, _ in splits.values():
        sizes += len(images)
        seen.update(image.numpy().tobytes() for image in images)
    assert sizes == 1797  # every sklearn digit used exactly once
    # sklearn's digits contain a few duplicate images; splits are by index, so near-total uniqueness holds
    assert len(seen) > 1700


def test_accuracy_floor(digits_model: nn.Module, digits_spec: ModelSpec) -> None:
    accuracy = compute_metric(digits_model, digits_spec.evaluation(), digits_spec.metric, torch.device("cpu"))
    assert accuracy >= 0.97


def test_weights_are_cached(digits_model: nn.Module) -> None:
    path = digits._weights_path()
    assert path.exists()
    rebuilt = digits.build()
    for key, value in digits_model.state_dict().items():
        assert torch.equal(value, rebuilt.state_dict()[key])


def test_example_inputs_any_batch() -> None:
    assert digits.example_inputs(1000)[0].shape == (1000, 1, 8, 8)
