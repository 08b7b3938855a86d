"""The noise-floor warning at the start of a study (paretorch.pipeline.core.noise_floor): a metric that bf16 rounding, a
second evaluation or near ties move by more than the allowed drop is said to be noise, with the pointer to
--eval-data."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from paretorch.pipeline.core.noise_floor import LABELLED_DATA_HINT, NoiseFloor, bf16_metric, near_tie_share
from paretorch.pipeline.core.spec import ModelSpec, load_model
from paretorch.pipeline.search import Search, SearchConfig
from paretorch.pipeline.search.store import ATTR_NOISE_FLOOR


class Flattened(nn.Module):
    """The model with its logits scaled down: every input a near tie between its classes."""

    def __init__(self, model: nn.Module, scale: float) -> None:
        super().__init__()
        self.model = model
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x) * self.scale


def prepared_lines(spec: ModelSpec, folder: Path) -> tuple[list[str], Search]:
    config = SearchConfig.load(None, runtimes=("eager",), latency_budget="quick", exports="none", presets=(),
                               seeds=[])
    search = Search(spec, torch.device("cpu"), config, storage=f"sqlite:///{folder / 'o.db'}", track=False)
    _study, prepared = search.prepare()
    return prepared.lines(), search


def test_a_near_tie_classifier_is_said_to_be_at_its_noise_floor(digits_spec: ModelSpec, tmp_path: Path) -> None:
    model = load_model(digits_spec)
    flat = dataclasses.replace(digits_spec, name="digits-near-ties", build=lambda: Flattened(model, 1e-3))
    lines, search = prepared_lines(flat, tmp_path)
    [warning] = [line for line in lines if "noise floor" in line]
    assert warning.startswith("warning: accuracy is at its noise floor: ")
    assert "100 % of the inputs are near ties" in warning and warning.endswith(LABELLED_DATA_HINT)
    stored = search.store.open_study(create=False).user_attrs[ATTR_NOISE_FLOOR]
    assert stored["near_ties"] == 1.0 and stored["bf16"] is not None, "measured once, stored on the study"


def test_bf16_or_a_second_evaluation_past_the_allowed_drop_is_noise() -> None:
    assert NoiseFloor(0.01, 0.0, 0.004, 0.1).line("accuracy") is None
    bf16 = NoiseFloor(0.01, 0.0, 0.08, 0.1).line("top1_agreement")
    assert bf16 is not None and "bf16 rounding alone moves it by 0.08, more than the allowed drop 0.01" in bf16
    again = NoiseFloor(0.01, 0.02, None, 0.0).line("accuracy")
    assert again is not None and "a second evaluation of the unoptimized model moves it by 0.02" in again


def test_near_ties_are_the_top_two_classes_within_the_margin() -> None:
    logits = torch.tensor([[5.0, 0.0, 0.0], [1.0, 0.99, 0.0], [0.0, 0.0, 0.0], [0.2, 0.0, 0.0]])
    assert near_tie_share(logits) == 0.75
    assert near_tie_share(torch.zeros(4, 1)) == 0.0


def test_where_cpu_bf16_is_slow_the_noise_pass_rounds_the_weights_and_restores_them(
        digits_spec: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARETORCH_CPU_BF16", "slow")
    model = load_model(digits_spec)
    before = [p.detach().clone() for p in model.parameters()]
    seen: list[torch.dtype] = []
    model.register_forward_pre_hook(lambda m, args: seen.extend(
        p.dtype for p in m.parameters()) if torch.is_autocast_enabled("cpu") else None)
    rounded = bf16_metric(model, digits_spec.evaluation(), digits_spec.metric, torch.device("cpu"))
    assert 0.5 < rounded <= 1.0
    assert not seen, "no autocast on a CPU where bf16 is slow"
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True)), "weights restored"
