"""A task metric that is a proxy of the user's: a rise over the unoptimized model is not credited.

A built-in task can stand in for the user's (MiniLM's word similarity for sentence embeddings). Optimizing a
trained model does not make it better at the user's task, and on MiniLM every recipe that raised the word score
(depth pruning +2.6 points, unstructured pruning +2.6) moved the embeddings away from fp32's while a
human-labelled sentence score stayed or fell (docs/metrics-and-task-data.md). So :func:`with_proxy_metric` reads
such a metric as at most the unoptimized model's value on the same rows: a trial is never ranked, nor kept
feasible, for a rise of the proxy; only its loss counts. The value as measured stays beside it as the extra
metric ``<name>_as_measured``. Labelled data of the user's own (``--eval-data``) replaces the proxy, and with it
this rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from paretorch.pipeline.core.spec import Metric, ModelSpec

#: The suffix of the extra metric that keeps the proxy's value as measured.
AS_MEASURED = "_as_measured"


def _capped(compute: Callable[[Tensor, Tensor], Tensor], reference: Callable[[], Tensor],
            higher_is_better: bool) -> Callable[[Tensor, Tensor], Tensor]:
    """``compute``, never better than its value on the unoptimized model's outputs (element by element)."""

    def capped(outputs: Tensor, targets: Tensor) -> Tensor:
        value = compute(outputs, targets)
        unoptimized = compute(reference().to(outputs.device), targets)
        return torch.minimum(value, unoptimized) if higher_is_better else torch.maximum(value, unoptimized)

    return capped


def proxy_metric(metric: Metric, reference: Callable[[], Tensor]) -> Metric:
    """``metric`` (and its bootstrap resamples, each against the same resample of the unoptimized model's)
    capped at the unoptimized model's value; ``reference()``: its outputs on the evaluation rows."""
    resampled = None if metric.resampled is None else _capped(metric.resampled, reference, metric.higher_is_better)
    return dataclasses.replace(metric, compute=_capped(metric.compute, reference, metric.higher_is_better),
                               resampled=resampled)


def with_proxy_metric(spec: ModelSpec) -> ModelSpec:
    """``spec`` whose metric is a proxy (see the module docstring): capped at the unoptimized model's value, the
    value as measured kept as an extra metric. The unoptimized model's
    outputs are the spec's shared ones (``ModelSpec.unoptimized``)."""
    batches = [inputs for inputs, _ in spec.evaluation()]

    def reference() -> Tensor:
        return spec.unoptimized_outputs.of(batches)

    measured = dataclasses.replace(spec.metric, name=spec.metric.name + AS_MEASURED, resampled=None)
    return dataclasses.replace(spec, metric=proxy_metric(spec.metric, reference),
                               extra_metrics=(measured, *spec.extra_metrics))
