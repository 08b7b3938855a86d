"""Fidelity metrics and fidelity specs (targets = the unoptimized model's own outputs)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.evaluate import compute_metric
from paretorch.pipeline.core.fidelity import (
    KL_DIVERGENCE,
    MEAN_COSINE,
    NEIGHBOUR_AGREEMENT,
    NEIGHBOUR_OVERLAP_AT_10,
    PAIRWISE_RANK_CORRELATION,
    SQNR_CAP_DB,
    SQNR_DB,
    TOP1_AGREEMENT,
    fidelity_metrics,
    fidelity_report,
    fidelity_spec,
    infer_output_kind,
    kl_divergence,
    mean_cosine,
    neighbour_agreement,
    sqnr_db,
    top1_agreement,
)

CPU = torch.device("cpu")


def _logits() -> torch.Tensor:
    return torch.randn(64, 10, generator=torch.Generator().manual_seed(0)) * 3


def test_top1_agreement_counts_unchanged_argmax() -> None:
    reference = _logits()
    assert top1_agreement(reference.clone(), reference).item() == 1.0
    changed = reference.clone()
    top = changed.argmax(dim=1)
    changed[:16, :] = 0.0
    changed[torch.arange(16), (top[:16] + 1) % 10] = 100.0  # the first quarter now predicts another class
    assert top1_agreement(changed, reference).item() == pytest.approx(0.75)


def test_kl_divergence_zero_for_identical_and_positive_otherwise() -> None:
    reference = _logits()
    assert kl_divergence(reference.clone(), reference).item() == pytest.approx(0.0, abs=1e-6)
    assert kl_divergence(reference * 0.5, reference).item() > 0.05
    assert not KL_DIVERGENCE.higher_is_better
    assert KL_DIVERGENCE.drop(baseline=0.0, value=0.2) == pytest.approx(0.2)


def test_mean_cosine_is_scale_invariant_and_sign_sensitive() -> None:
    reference = torch.randn(32, 3, 4, generator=torch.Generator().manual_seed(1))  # flattened per sample
    assert mean_cosine(reference * 7.0, reference).item() == pytest.approx(1.0, abs=1e-6)
    assert mean_cosine(-reference, reference).item() == pytest.approx(-1.0, abs=1e-6)


def test_sqnr_matches_the_definition_and_is_capped_for_identical_outputs() -> None:
    reference = torch.ones(10, 10)
    noisy = reference + 0.1  # signal 100, noise 1 -> 20 dB
    assert sqnr_db(noisy, reference).item() == pytest.approx(20.0, abs=1e-4)
    assert sqnr_db(reference.clone(), reference).item() == pytest.approx(SQNR_CAP_DB)
    assert math.isfinite(sqnr_db(torch.zeros(3, 3), torch.zeros(3, 3)).item())


def test_neighbour_agreement_one_for_identical_and_lower_when_neighbours_change() -> None:
    embeddings = nn.functional.normalize(torch.randn(50, 16, generator=torch.Generator().manual_seed(2)), dim=1)
    assert neighbour_agreement(embeddings.clone(), embeddings).item() == 1.0
    noisy = embeddings + 0.5 * torch.randn(50, 16, generator=torch.Generator().manual_seed(3))
    assert neighbour_agreement(noisy, embeddings).item() < 0.8
    with pytest.raises(ValueError, match="at least 2 samples"):
        neighbour_agreement(embeddings[:1], embeddings[:1])


def test_metrics_reject_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"mean_cosine: outputs \(4, 3\) and targets \(4, 2\) differ"):
        mean_cosine(torch.zeros(4, 3), torch.zeros(4, 2))


def test_output_kind_rule() -> None:
    assert infer_output_kind(_logits()) == "logits"
    assert infer_output_kind(nn.functional.normalize(_logits(), dim=1)) == "embedding"
    assert infer_output_kind(torch.randn(8)) == "embedding"  # one value per sample: a regressor
    assert infer_output_kind(torch.randn(8, 1)) == "embedding"
    assert infer_output_kind(torch.randn(8, 4, 5)) == "embedding"
    assert fidelity_metrics("logits") == (TOP1_AGREEMENT, KL_DIVERGENCE)
    assert fidelity_metrics("embedding") == (MEAN_COSINE, PAIRWISE_RANK_CORRELATION, NEIGHBOUR_OVERLAP_AT_10, SQNR_DB)
    with pytest.raises(ValueError, match="unknown output kind 'x'"):
        fidelity_metrics("x")


def test_fidelity_report_names_every_metric() -> None:
    reference = _logits()
    report = fidelity_report(reference, reference, (TOP1_AGREEMENT, KL_DIVERGENCE, NEIGHBOUR_AGREEMENT))
    assert report == pytest.approx({"top1_agreement": 1.0, "kl_divergence": 0.0, "neighbour_agreement": 1.0})


# --------------------------------------------------------------------------- fidelity specs


def _damaged(model: nn.Module, scale: float) -> nn.Module:
    damaged = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in damaged.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * parameter.std() * scale)
    return damaged


def test_fidelity_spec_of_a_classifier_uses_top1_and_computes_targets_once(residual_spec) -> None:
    model = residual_spec.build()
    builds = []

    def build() -> nn.Module:
        builds.append(1)
        return model

    inputs = [batch for batch, _ in residual_spec.evaluation()]
    spec = fidelity_spec(
        "residual_fidelity", build, residual_spec.example_inputs, residual_spec.calibration, lambda: inputs
    )
    assert spec.metric is TOP1_AGREEMENT  # auto: 2-D logits
    first, second = spec.evaluation(), spec.evaluation()
    assert len(builds) == 1 and first[0][1] is second[0][1]
    assert compute_metric(model, first, spec.metric, CPU) == 1.0
    assert compute_metric(_damaged(model, 1.0), first, spec.metric, CPU) < 0.9
    assert compute_metric(_damaged(model, 1.0), first, KL_DIVERGENCE, CPU) > 0.01


def test_fidelity_spec_of_an_embedding_model_uses_cosine() -> None:
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 6)).eval()

    class Normalized(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.normalize(self.encoder(x), dim=1)

    model = Normalized().eval()
    data = torch.randn(40, 8, generator=torch.Generator().manual_seed(4))
    spec = fidelity_spec(
        "embedder", lambda: model, lambda b: (data[:b],), lambda: [(data[:8],)], lambda: [(data[8:24],), (data[24:],)]
    )
    assert spec.metric is MEAN_COSINE
    assert compute_metric(model, spec.evaluation(), spec.metric, CPU) == pytest.approx(1.0, abs=1e-6)
    assert compute_metric(_damaged(model, 0.5), spec.evaluation(), spec.metric, CPU) < 0.99


def test_fidelity_spec_rejects_unknown_output_kind_and_empty_evaluation() -> None:
    model = nn.Linear(4, 3)
    with pytest.raises(SpecError, match="unknown output kind 'probabilities'"):
        fidelity_spec("m", lambda: model, lambda b: (torch.zeros(b, 4),), list, list, output_kind="probabilities")
    with pytest.raises(SpecError, match="evaluation set is empty"):
        fidelity_spec("m", lambda: model, lambda b: (torch.zeros(b, 4),), list, list)
