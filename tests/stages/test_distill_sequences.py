"""Distillation of padded sequence models: batches cut to their longest sample, grouped by
length, the teacher's outputs kept per sample, and fp32 training where autocast is slow."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import Tensor, nn

from paretorch.pipeline.core.device import capabilities
from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.spec import ACCURACY, ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply_stage
from paretorch.pipeline.core.training_data import distillation_data
from paretorch.stages.distill.loop import LENGTH_GROUP_BATCHES, Distiller, length_grouped
from paretorch.stages.distill.losses import LossWeights
from paretorch.stages.distill.stage import DistillConfig, autocast_dtype

CPU = torch.device("cpu")
PADDED = 24


class MaskedMean(nn.Module):
    """Token embeddings through a layer, mean-pooled over the mask: padding changes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.layer = nn.Linear(8, 8)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        weights = mask.unsqueeze(-1).float()
        return (torch.tanh(self.layer(self.embed(ids))) * weights).sum(1) / weights.sum(1)


def padded_batch(count: int, seed: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 21, (count,), generator=generator)
    mask = (torch.arange(PADDED) < lengths[:, None]).long()
    ids = torch.randint(1, 50, (count, PADDED), generator=generator) * mask
    return ids, mask


def sequence_spec(training: tuple[Tensor, Tensor], padding_mask: int | None = 1) -> ModelSpec:
    evaluation = padded_batch(16, seed=99)
    return ModelSpec(
        name="seq", build=MaskedMean, example_inputs=lambda n: tuple(t[:n] for t in evaluation),
        calibration=lambda: [training], evaluation=lambda: [(evaluation, torch.zeros(16, dtype=torch.long))],
        metric=ACCURACY, training_inputs=lambda: [training], output_kind="embedding", padding_mask=padding_mask,
    )


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return sequence_spec(padded_batch(96, seed=0))


def test_a_batch_is_cut_to_its_longest_sample_and_the_loss_is_unchanged(spec: ModelSpec) -> None:
    data = distillation_data(spec)
    assert data is not None and data.padding_mask == 1
    index = torch.tensor([3, 7, 11])
    (ids, mask), _ = data.batch(index)
    longest = int(data.inputs[1][index].sum(dim=1).max())
    assert ids.shape == mask.shape == (3, longest) and longest < PADDED
    teacher = MaskedMean()
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        student.layer.weight.mul_(0.5)
    full = Distiller(student, teacher, dataclasses.replace(data, padding_mask=None), "embedding",
                     LossWeights(), CPU, None)
    cut = Distiller(student, teacher, data, "embedding", LossWeights(), CPU, None)
    cut_loss, full_loss = float(cut.loss(index).detach()), float(full.loss(index).detach())
    assert cut_loss == pytest.approx(full_loss, rel=1e-5) and cut_loss > 0.0


def test_length_grouping_keeps_the_samples_and_removes_padding() -> None:
    lengths = torch.randint(1, 100, (640,), generator=torch.Generator().manual_seed(1))
    batches = list(torch.randperm(640, generator=torch.Generator().manual_seed(2)).split(10))
    grouped = length_grouped(batches, lengths, torch.Generator().manual_seed(3))
    assert sorted(torch.cat(grouped).tolist()) == list(range(640))
    assert [len(b) for b in grouped] == [10] * 64
    first_group = set(torch.cat(batches[:LENGTH_GROUP_BATCHES]).tolist())
    assert set(torch.cat(grouped[:LENGTH_GROUP_BATCHES]).tolist()) == first_group  # order stays local

    def padded_tokens(bs: list[Tensor]) -> int:
        return sum(int(lengths[b].max()) * len(b) for b in bs)

    assert padded_tokens(grouped) < 0.75 * padded_tokens(batches)
    again = length_grouped(batches, lengths, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(grouped, again, strict=True))


def test_the_teacher_runs_about_once_per_sample_not_once_per_step(spec: ModelSpec) -> None:
    student = MaskedMean()
    teacher = MaskedMean()
    ctx = StageContext(spec, CPU, source_model=teacher)
    apply_stage(student, DistillConfig(steps=60, batch_size=16), ctx)
    # 96 samples / 16 = 6 batches an epoch; probes before and after: 6 more batches each.
    assert ctx.records["distill.steps"] == 60
    assert ctx.records["distill.teacher_passes"] <= 6 + 2 * 6


def test_matching_hidden_layers_runs_the_teacher_every_step(spec: ModelSpec) -> None:
    ctx = StageContext(spec, CPU, source_model=MaskedMean())
    config = DistillConfig(steps=20, batch_size=16, layer_map=(("layer", "layer"),))
    apply_stage(MaskedMean(), config, ctx)
    assert ctx.records["distill.teacher_passes"] >= 20


@pytest.mark.parametrize(("training", "padding_mask", "message"), [
    (padded_batch(8, seed=5), 2, r"padding_mask=2 but the model takes 2 inputs"),
    ((padded_batch(8, seed=5)[0], padded_batch(8, seed=5)[1].flip(1)), 1, r"is not padded on the right"),
    ((padded_batch(8, seed=5)[0], padded_batch(8, seed=5)[1][:, :, None]), 1, r"a \(batch, sequence\) mask"),
])
def test_a_wrong_padding_mask_is_one_clear_error(training: tuple[Tensor, Tensor], padding_mask: int,
                                                 message: str) -> None:
    with pytest.raises(SpecError, match=message):
        distillation_data(sequence_spec(training, padding_mask))


def test_distillation_trains_in_fp32_where_autocast_training_is_not_faster(spec: ModelSpec) -> None:
    assert autocast_dtype(capabilities(CPU)) is None  # CPU row: inference-fast bf16, not training-fast
    ctx = StageContext(spec, CPU, source_model=MaskedMean())
    apply_stage(MaskedMean(), DistillConfig(steps=2, batch_size=16), ctx)
    assert ctx.records["distill.autocast"] == "float32"


def test_a_second_distillation_by_the_same_teacher_reuses_its_outputs(spec: ModelSpec) -> None:
    """A search distils many students from one teacher (the unoptimized model) on the same data: the teacher's
    outputs are kept for the process, so a later trial runs the teacher over no sample it already saw."""
    teacher = MaskedMean()
    first = StageContext(spec, CPU, source_model=teacher)
    apply_stage(MaskedMean(), DistillConfig(steps=12, batch_size=16), first)
    second = StageContext(spec, CPU, source_model=teacher)
    apply_stage(MaskedMean(), DistillConfig(steps=12, batch_size=16), second)
    assert first.records["distill.teacher_passes"] >= 6
    assert second.records["distill.teacher_passes"] < first.records["distill.teacher_passes"]
    other = StageContext(spec, CPU, source_model=MaskedMean())  # another teacher: its own outputs
    apply_stage(MaskedMean(), DistillConfig(steps=12, batch_size=16), other)
    assert other.records["distill.teacher_passes"] >= 6
