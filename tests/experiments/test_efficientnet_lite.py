"""The EfficientNet-Lite0 spec (issue 46.6, a held-out CNN from packages): loads offline, classifies the shipped
photographs as ImageNet's classes, fixed disjoint crops, and a short search on it finds a front."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

from paretorch.experiments.models import efficientnet_lite
from paretorch.experiments.models.efficientnet_lite import Crops
from paretorch.pipeline.core.fidelity import TOP1_AGREEMENT
from paretorch.pipeline.core.spec import load_model
from paretorch.pipeline.search import Search, SearchConfig, run_search
from paretorch.pipeline.search.objectives import ATTR_REASON, ATTR_SEED

#: Run alone (make test's serial pass): a short search's front rests on measured speed.
pytestmark = pytest.mark.serial

CPU = torch.device("cpu")
#: ImageNet's classes of the centre crops of scikit-learn's china.jpg and flower.jpg and matplotlib's
#: grace_hopper.jpg: palace, daisy, military uniform (as at the checkpoint's own 224 x 224).
PHOTO_CLASSES = [698, 985, 652]
#: A spec small enough for a search of a few trials in CI.
SMALL = Crops(evaluation=32, calibration=8, training=16)


@pytest.fixture(scope="module")
def lite0() -> Iterator[nn.Module]:
    """The model, built once with every socket connection refused (nothing is downloaded)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("network access attempted while loading EfficientNet-Lite0")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        yield load_model(efficientnet_lite.spec())


def test_loads_offline_and_names_the_photographs_imagenet_classes(lite0: nn.Module) -> None:
    centre = []
    for photo in efficientnet_lite.photographs():
        side = min(photo.shape[:2])
        top, left = (photo.shape[0] - side) // 2, (photo.shape[1] - side) // 2
        centre.append(efficientnet_lite.resized(Image.fromarray(photo[top : top + side, left : left + side])))
    with torch.inference_mode():
        logits = lite0(efficientnet_lite.model_inputs(centre))
    assert logits.shape == (3, 1000)
    assert logits.argmax(dim=1).tolist() == PHOTO_CLASSES
    assert sum(p.numel() for p in lite0.parameters()) == 4_652_008


def test_crops_are_fixed_distinct_and_never_in_two_splits() -> None:
    splits = {name: efficientnet_lite.images(name, SMALL) for name in efficientnet_lite.SPLITS}
    size = efficientnet_lite.RESOLUTION
    assert {name: tuple(t.shape) for name, t in splits.items()} == {
        "evaluation": (32, 3, size, size), "calibration": (8, 3, size, size), "training": (16, 3, size, size)}
    rows = [image.numpy().tobytes() for tensor in splits.values() for image in tensor]
    assert len(set(rows)) == len(rows) == 56
    first = efficientnet_lite.images("evaluation", SMALL)
    efficientnet_lite._splits.cache_clear()
    assert torch.equal(efficientnet_lite.images("evaluation", SMALL), first)  # the seed fixes them
    # scaled as TensorFlow Lite's checkpoints expect: (pixel - 127) / 128
    assert -1.0 <= float(first.min()) < -0.9 and 0.9 < float(first.max()) <= 1.0


def test_a_short_search_on_it_finds_a_front(tmp_path: Path) -> None:
    """Three trials under eager and ONNX Runtime, quick latency, no exports, one thread: the baseline agrees with
    itself, every trial finishes with a state and a front is found."""
    torch.set_num_threads(1)
    spec = efficientnet_lite.spec(SMALL)
    assert spec.metric == TOP1_AGREEMENT and spec.output_kind == "logits"
    config = SearchConfig.load(None, runtimes=("eager", "onnxruntime"), latency_budget="quick", exports="none")
    search = Search(spec, CPU, config, storage=f"sqlite:///{tmp_path / 'optuna.db'}", track=False)
    outcome = run_search(search, trials=3)
    trials = outcome.study.trials
    states = [(t.number, t.state.name, t.user_attrs.get(ATTR_REASON)) for t in trials]
    assert trials[0].user_attrs[ATTR_SEED] == "baseline" and trials[0].values[0] == 1.0, states
    assert sum(t.state.is_finished() for t in trials) >= 3, states
    assert outcome.pareto and all(t.values[0] >= 1.0 - 0.01 for t in outcome.pareto), states
