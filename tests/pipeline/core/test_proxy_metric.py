"""A proxy task metric (paretorch.pipeline.core.proxy_metric): a rise over the unoptimized model is not credited, a fall
is."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.evaluate import evaluation_outputs
from paretorch.pipeline.core.proxy_metric import AS_MEASURED, with_proxy_metric
from paretorch.pipeline.core.spec import ACCURACY, ModelSpec

INPUTS = torch.eye(8)
LABELS = torch.arange(8)


class Lookup(nn.Module):
    """Predicts ``answers[i]`` for the one-hot input i."""

    def __init__(self, answers: list[int]) -> None:
        super().__init__()
        self.table = nn.Parameter(nn.functional.one_hot(torch.tensor(answers), 8).float() * 10)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.table


def spec() -> ModelSpec:
    unoptimized = Lookup([0, 1, 2, 3, 4, 5, 0, 0])  # 6 of 8 right
    return ModelSpec(name="lookup", build=lambda: unoptimized, example_inputs=lambda b: (INPUTS[:b],),
                     calibration=lambda: [(INPUTS,)], evaluation=lambda: [((INPUTS,), LABELS)], metric=ACCURACY)


def scored(proxied: ModelSpec, model: nn.Module) -> dict[str, float]:
    outputs, targets = evaluation_outputs(model, proxied.evaluation(), torch.device("cpu"))
    return {m.name: float(m.compute(outputs, targets)) for m in (proxied.metric, *proxied.extra_metrics)}


def test_a_rise_reads_as_the_unoptimized_value_and_the_measured_value_stays_beside_it() -> None:
    proxied = with_proxy_metric(spec())
    better = scored(proxied, Lookup(list(range(8))))
    assert better == {"accuracy": 0.75, "accuracy" + AS_MEASURED: 1.0}


def test_a_fall_counts_in_full() -> None:
    proxied = with_proxy_metric(spec())
    assert scored(proxied, Lookup([0, 1, 2, 0, 0, 0, 0, 0])) == {"accuracy": 0.375, "accuracy" + AS_MEASURED: 0.375}


def test_each_bootstrap_resample_is_capped_against_the_same_resample() -> None:
    proxied = with_proxy_metric(spec())
    assert proxied.metric.resampled is not None
    outputs, targets = evaluation_outputs(Lookup(list(range(8))), proxied.evaluation(), torch.device("cpu"))
    reference, _ = evaluation_outputs(spec().build(), proxied.evaluation(), torch.device("cpu"))
    capped = proxied.metric.resampled(outputs, targets)
    base = ACCURACY.resampled(reference, targets)  # type: ignore[misc]
    assert torch.equal(capped, base), "a model right everywhere reads as the unoptimized one on every resample"
