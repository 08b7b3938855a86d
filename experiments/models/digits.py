"""A small CNN trained on scikit-learn's bundled handwritten digits (8x8, 10 classes).

Real data, fixed seed, and train / calibration / evaluation splits that never
overlap. The trained weights are cached in the results directory under a hash
of this file and the settings, so training runs once (a minute or more on a busy CPU,
with a progress line), not per command.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.paths import cache_dir
from paretorch.pipeline.core.progress import phase
from paretorch.pipeline.core.spec import ACCURACY, Batch, LabelledBatch, ModelSpec

SETTINGS: dict[str, int] = {"seed": 0, "epochs": 40, "batch_size": 64, "train": 1200, "calibration": 200}
LEARNING_RATE = 2e-3
EVAL_BATCH = 128


class DigitsCNN(nn.Module):
    """Three conv blocks and a two-layer head; BatchNorm so BN-scale pruning applies."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 16, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


@cache
def _splits() -> dict[str, tuple[Tensor, Tensor]]:
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SETTINGS["seed"]))
    n_train, n_cal = SETTINGS["train"], SETTINGS["calibration"]
    parts = {
        "train": order[:n_train],
        "calibration": order[n_train : n_train + n_cal],
        "evaluation": order[n_train + n_cal :],
    }
    return {name: (images[idx], labels[idx]) for name, idx in parts.items()}


def _batches(split: str, batch_size: int) -> list[LabelledBatch]:
    images, labels = _splits()[split]
    return [((images[i : i + batch_size],), labels[i : i + batch_size]) for i in range(0, len(labels), batch_size)]


def _weights_path() -> Path:
    source = Path(__file__).read_bytes()
    settings = json.dumps({**SETTINGS, "lr": LEARNING_RATE}, sort_keys=True).encode()
    digest = hashlib.sha256(source + settings).hexdigest()[:16]
    return cache_dir("weights") / f"digits-{digest}.pt"


def train() -> nn.Module:
    """Train the CNN from scratch on the train split (deterministic on the CPU)."""
    torch.manual_seed(SETTINGS["seed"])
    model = DigitsCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=SETTINGS["epochs"])
    images, labels = _splits()["train"]
    generator = torch.Generator().manual_seed(SETTINGS["seed"])
    model.train()
    epochs = SETTINGS["epochs"]
    with phase(f"digits: training the model once ({epochs} epochs), cached afterwards", total=epochs) as shown:
        for _ in range(epochs):
            order = torch.randperm(len(labels), generator=generator)
            for start in range(0, len(labels), SETTINGS["batch_size"]):
                idx = order[start : start + SETTINGS["batch_size"]]
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(images[idx]), labels[idx]).backward()
                optimizer.step()
            scheduler.step()
            shown.advance()
    return model.eval()


def build() -> nn.Module:
    """The trained CNN in eval mode: from the weight cache, or trained once and cached."""
    path = _weights_path()
    model: nn.Module = DigitsCNN()
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    model = train()
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, path)
    return model


def example_inputs(batch_size: int) -> Batch:
    images, _ = _splits()["evaluation"]
    repeats = -(-batch_size // len(images))
    return (images.repeat(repeats, 1, 1, 1)[:batch_size].contiguous(),)


def calibration() -> list[Batch]:
    return [inputs for inputs, _ in _batches("calibration", 50)]


def evaluation() -> list[LabelledBatch]:
    return _batches("evaluation", EVAL_BATCH)


def training() -> list[LabelledBatch]:
    return _batches("train", SETTINGS["batch_size"])


def spec() -> ModelSpec:
    return ModelSpec(
        name="digits",
        build=build,
        example_inputs=example_inputs,
        calibration=calibration,
        evaluation=evaluation,
        metric=ACCURACY,
        latency_batch_sizes=(1, 32),
        training=training,
        loss=nn.functional.cross_entropy,
        output_kind="logits",
        description="3-conv CNN on scikit-learn's 8x8 handwritten digits (accuracy)",
    )
