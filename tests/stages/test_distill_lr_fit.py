"""Recovery that does not destroy (issue 46.4): distillation trains at a rate fitted to the model, and a run that
leaves the model worse than it started stops there, with its reason; on the trained digits CNN."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.spec import ModelSpec
from paretorch.pipeline.core.stage import StageContext, apply_stage
from paretorch.stages.distill.lr_fit import FIT_CANDIDATES, candidates, fit_steps
from paretorch.stages.distill.stage import DistillConfig
from paretorch.stages.prune.stage import PruneConfig

CPU = torch.device("cpu")
#: A rate far too high for a trained CNN (AdamW moves each weight by about this much a step).
WRECKING_LR = 3e-2


def agreement(student: nn.Module, teacher: nn.Module, spec: ModelSpec) -> float:
    """Top-1 agreement of ``student`` with ``teacher`` on the evaluation data."""
    same = total = 0
    with torch.no_grad():
        for inputs, _ in spec.evaluation():
            same += int((student(*inputs).argmax(-1) == teacher(*inputs).argmax(-1)).sum())
            total += len(inputs[0])
    return same / total


def screen(config: DistillConfig) -> DistillConfig:
    screened = config.low_fidelity()
    assert screened is not None
    return screened


def distill(model: nn.Module, config: DistillConfig, spec: ModelSpec, teacher: nn.Module) -> tuple[nn.Module,
                                                                                                    StageContext]:
    ctx = StageContext(spec, CPU, source_model=teacher)
    result: nn.Module = apply_stage(model, config, ctx)
    return result, ctx


@pytest.mark.parametrize("lr", [WRECKING_LR, 3e-4])
def test_the_first_screen_of_a_trained_cnn_never_leaves_it_worse(digits_spec: ModelSpec, digits_model: nn.Module,
                                                                  lr: float) -> None:
    """The unpruned model already matches its teacher: every tried rate raises the loss, so no step runs and the
    model comes back as it was, with the reason naming distill and each rate it tried."""
    distilled, ctx = distill(digits_model, screen(DistillConfig(steps=100, lr=lr)), digits_spec, digits_model)
    assert agreement(distilled, digits_model, digits_spec) == 1.0
    assert all(torch.equal(a, b) for a, b in zip(distilled.state_dict().values(),
                                                 digits_model.state_dict().values(), strict=True))
    reason = ctx.records["distill.kept_start"]
    assert reason.startswith("distill: no learning rate from ") and reason.count("->") == FIT_CANDIDATES
    assert ctx.records["distill.steps"] == 0


def test_without_the_fit_a_wrecking_rate_is_caught_by_the_end_check(digits_spec: ModelSpec,
                                                                    digits_model: nn.Module) -> None:
    """The rate the fit would have refused, forced: training at it raises the loss, and the stage says so."""
    with pytest.raises(InfeasibleConfig, match=r"^distill made the model worse: loss .* at lr=0.03"):
        distill(digits_model, screen(DistillConfig(steps=100, lr=WRECKING_LR, fit_lr=False)), digits_spec,
                digits_model)


def test_a_pruned_cnn_recovers_at_a_fitted_rate_and_the_replay_trains_the_same(digits_spec: ModelSpec,
                                                                               digits_model: nn.Module) -> None:
    pruned = apply_stage(digits_model, PruneConfig(ratio=0.5), StageContext(digits_spec, CPU))
    start = agreement(pruned, digits_model, digits_spec)
    config = DistillConfig(steps=60, lr=WRECKING_LR)
    distilled, ctx = distill(pruned, config, digits_spec, digits_model)
    assert agreement(distilled, digits_model, digits_spec) > max(start, 0.95)
    assert ctx.records["distill.lr"] < WRECKING_LR  # the configured rate raised the loss; a lower one trained
    assert ctx.records["distill.lr"] in candidates(WRECKING_LR)
    assert ctx.records["distill.lr_fit"].startswith("0.03 -> ")
    resolved = ctx.resolved_config
    assert isinstance(resolved, DistillConfig) and not resolved.fit_lr and resolved.lr == ctx.records["distill.lr"]
    replayed, _ = distill(pruned, resolved, digits_spec, digits_model)
    for (name, a), (_, b) in zip(distilled.state_dict().items(), replayed.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"{name} differs between the fitted run and its replay"


def test_the_fit_is_a_tenth_of_the_run_within_bounds() -> None:
    assert [fit_steps(steps) for steps in (1, 25, 40, 100, 400)] == [2, 2, 4, 5, 5]
    assert candidates(1e-3)[0] == 1e-3 and candidates(1e-3)[-1] == pytest.approx(1e-3 / 10**1.5)
