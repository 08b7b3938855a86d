"""Per-input agreement and the tail guard (paretorch.pipeline.core.input_agreement) on outputs with planted tails."""

from __future__ import annotations

import pytest
import torch

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.input_agreement import (
    BROKEN_SHARE,
    COSINE_P01,
    FLIP_SHARE,
    TAIL_ON_SUBSET,
    InputAgreement,
    TailGuard,
    cell,
    wilson_low,
)
from paretorch.pipeline.core.tail_limit import parse_tail_limit


def unit_rows(n: int, dim: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)


def planted(reference: torch.Tensor, rows: list[int], noise: float = 2.0) -> torch.Tensor:
    """``reference`` with ``rows`` pushed far from their own direction (cosine well below 0.9)."""
    outputs = reference.clone()
    push = unit_rows(len(rows), reference.shape[1], seed=1)
    outputs[rows] = torch.nn.functional.normalize(reference[rows] + noise * push, dim=1)
    return outputs


def test_a_planted_embedding_tail_is_counted_quantiled_and_named() -> None:
    reference = unit_rows(200)
    outputs = planted(reference, [3, 50, 120, 199, 7])  # 2.5 % of the inputs
    texts = [f"sentence {i}" for i in range(200)]
    agreement = InputAgreement.of(outputs, reference, "embedding")
    assert agreement.measure == "cosine"
    assert agreement.broken_share == pytest.approx(5 / 200)
    metrics = agreement.metrics()
    assert metrics[COSINE_P01] < 0.9 and metrics[BROKEN_SHARE] == pytest.approx(0.025)
    worst = agreement.worst(5, texts)
    assert sorted(int(row["index"]) for row in worst) == [3, 7, 50, 120, 199]
    assert all(row["text"] == f"sentence {row['index']}" and row["broken"] for row in worst)
    assert [row["cosine"] for row in worst] == sorted(row["cosine"] for row in worst), "worst first"
    assert cell(metrics).endswith("2.5 % broken")


def test_identical_outputs_break_nothing_zero_rows_included() -> None:
    reference = torch.cat([unit_rows(10), torch.zeros(2, 16)])
    agreement = InputAgreement.of(reference.clone(), reference, "embedding")
    assert agreement.broken_share == 0.0 and float(agreement.values.min()) == pytest.approx(1.0)


def test_a_flip_breaks_only_where_the_unoptimized_model_was_confident() -> None:
    confident = torch.tensor([[8.0, 0.0, 0.0]] * 50)
    tied = torch.tensor([[1.0, 0.95, 0.0]] * 50)
    reference = torch.cat([confident, tied])
    outputs = reference.clone()
    outputs[:2] = outputs[:2].roll(1, dims=1)  # two confident inputs flip
    outputs[50:60] = outputs[50:60][:, [1, 0, 2]]  # ten near ties flip
    agreement = InputAgreement.of(outputs, reference, "logits")
    metrics = agreement.metrics()
    assert metrics[FLIP_SHARE] == pytest.approx(12 / 100)
    assert metrics[BROKEN_SHARE] == pytest.approx(2 / 100), "only the confident flips broke"
    worst = agreement.worst()
    assert [row["index"] for row in worst[:2]] == [0, 1] and len(worst) == 12, "confident flips first, flips only"


def test_one_value_per_input_reports_error_quantiles_and_breaks_nothing() -> None:
    reference = torch.linspace(0, 1, 100).unsqueeze(1)
    outputs = reference + 0.01
    outputs[5] += 1.0
    agreement = InputAgreement.of(outputs, reference, "embedding")
    assert agreement.measure == "abs_error" and agreement.broken_share == 0.0
    assert agreement.metrics()["input_abs_error_max"] == pytest.approx(1.01, abs=1e-5)
    assert agreement.worst(1)[0]["index"] == 5


def test_shapes_must_match() -> None:
    with pytest.raises(SpecError, match="differ in shape"):
        InputAgreement.of(torch.zeros(3, 4), torch.zeros(3, 5), "embedding")


def test_the_guard_fails_past_its_limit_with_the_reason_in_words() -> None:
    guard = TailGuard(0.01, 0.8)
    assert guard.failure({COSINE_P01: 0.7, BROKEN_SHARE: 0.052}) == (
        "5.2 % of inputs below cosine 0.8 to the unoptimized outputs (tail limit 1 %)")
    assert guard.failure({COSINE_P01: 0.95, BROKEN_SHARE: 0.01}) is None, "at the limit passes"
    assert guard.failure({}) is None, "nothing measured per input: nothing to judge"
    assert guard.failure({COSINE_P01: 0.7, BROKEN_SHARE: 0.015}, factor=2.0) is None, "a screen allows twice"
    assert "with a confident prediction flipped" in (guard.failure({FLIP_SHARE: 0.1, BROKEN_SHARE: 0.05}) or "")
    assert TailGuard(None).failure({COSINE_P01: 0.1, BROKEN_SHARE: 0.9}) is None, "off"


def test_the_subset_verdict_needs_confidence() -> None:
    reference = unit_rows(400)
    guard = TailGuard(0.01)
    clear = InputAgreement.of(planted(reference, list(range(0, 400, 20))), reference, "embedding")  # 5 %
    assert (guard.subset_failure(clear, "subset 400 of 1600 rows") or "").startswith(
        f"{TAIL_ON_SUBSET} (subset 400 of 1600 rows): 5.0 % of inputs below cosine 0.9")
    near = InputAgreement.of(planted(reference, [0, 200, 300, 399, 5, 6]), reference, "embedding")  # 1.5 %
    assert guard.subset_failure(near, "subset") is None, "1.5 % of 400 is not clear of 1 %: score it in full"


@pytest.mark.parametrize(("given", "share"), [("1%", 0.01), ("0.02", 0.02), (0.05, 0.05), ("off", None),
                                              (None, None), ("0%", 0.0)])
def test_tail_limits_parse(given: object, share: float | None) -> None:
    assert parse_tail_limit(given) == share


@pytest.mark.parametrize("given", ["much", "100%", "-1%", "2"])
def test_bad_tail_limits_say_what_to_give(given: str) -> None:
    with pytest.raises(ValueError, match="give"):
        parse_tail_limit(given)


def test_wilson_low_is_below_the_share_and_above_zero_for_many_hits() -> None:
    assert 0.0 < wilson_low(20, 400) < 0.05
    assert wilson_low(0, 400) == 0.0
    assert wilson_low(6, 400) < 0.01 < 6 / 400
