"""Score a model on labelled data (``--eval-data``, :mod:`paretorch.pipeline.core.task_data`) instead of fidelity.

:func:`with_task_data` turns any :class:`ModelSpec` (a Python spec, a TorchScript or
``.pt2`` file, an ``hf:`` directory) into one whose metric is the task's: accuracy,
Spearman x 100 of pair similarities, or nDCG@10. The fidelity metrics to the unoptimized
model stay on every trial as extra metrics (computed against its outputs on the same
rows, once), so a user sees both "as good on my task" and "how far from the original".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.fidelity import NEIGHBOUR_AGREEMENT, fidelity_metrics
from paretorch.pipeline.core.padding import trim_to_longest
from paretorch.pipeline.core.spec import Batch, LabelledBatch, Metric, ModelSpec, split_batches
from paretorch.pipeline.core.task_data import ClassificationData, PairsData, RetrievalData, TaskData, resolve_labels
from paretorch.pipeline.core.task_metrics import classification_metrics, pairs_metric, retrieval_metrics


@dataclasses.dataclass(frozen=True)
class TaskRows:
    """What the model is run on and how the metric reads it: inputs, targets, metrics."""

    inputs: Batch
    targets: Tensor
    metrics: tuple[Metric, ...]
    #: The text of each row (empty: the rows are tensors).
    texts: tuple[str, ...] = ()


#: Text rows are sorted by length within windows of this many, and every evaluation batch is cut to its longest
#: row: a batch then holds sentences of about one length (on 2,910 dev sentences in batches of 32, 54k token
#: positions instead of 154k padded to the longest of all), while any leading multiple of 256 rows holds the same
#: texts as the file's leading rows (the self-check's subset reads them).
LENGTH_WINDOW = 256


def distinct_texts(texts: Sequence[str]) -> tuple[list[str], list[int]]:
    """The distinct texts in first-seen order, and each input's index among them."""
    index: dict[str, int] = {}
    positions = [index.setdefault(text, len(index)) for text in texts]
    return list(index), positions


def given_texts(data: TaskData) -> tuple[str, ...]:
    """The data's distinct texts in the file's order (a workload is timed on them as the user gave them)."""
    if isinstance(data, PairsData):
        return tuple(distinct_texts([*data.first, *data.second])[0])
    if isinstance(data, RetrievalData):
        return tuple(dict.fromkeys((*data.queries, *data.corpus)))
    return tuple(dict.fromkeys(data.texts or ()))


def windowed_length_order(lengths: Tensor, window: int | None = None) -> Tensor:
    """Row indices sorted by ``lengths`` (stable) within consecutive windows of ``window`` rows (default
    :data:`LENGTH_WINDOW`)."""
    window = window or LENGTH_WINDOW
    return torch.cat([start + torch.sort(lengths[start : start + window], stable=True).indices
                      for start in range(0, int(lengths.shape[0]), window)])


def _encode(spec: ModelSpec, texts: Sequence[str], data: TaskData) -> Batch:
    if spec.encode_text is None:
        raise SpecError(f"--eval-data {data.source} holds text, but model '{spec.name}' has no text encoder: "
                        "a Python spec sets ModelSpec(encode_text=its tokenizer); a TorchScript/.pt2 model takes "
                        "a .pt file of tensor inputs and labels")
    return spec.encode_text(list(texts))


def _classes(spec: ModelSpec, inputs: Batch) -> int:
    """The number of classes, from the model's output on two evaluation rows."""
    model = spec.build().eval()  # outside inference mode: a spec's build may train on first use
    with torch.inference_mode():
        output = model(*(t[:2] for t in inputs))
    if not isinstance(output, Tensor) or output.dim() != 2 or output.shape[1] < 2:
        shape = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise SpecError(f"model '{spec.name}' returns {shape}; classification data needs (batch, classes) logits")
    return int(output.shape[1])


def task_rows(spec: ModelSpec, data: TaskData, label_names: Sequence[str] = ()) -> TaskRows:
    """Encode the data's rows for ``spec``'s model and build the task's metrics (primary first)."""
    if isinstance(data, ClassificationData):
        inputs = data.tensors if data.tensors is not None else _encode(spec, data.texts or (), data)
        classes = _classes(spec, inputs)
        return TaskRows(inputs, resolve_labels(data, classes, label_names), classification_metrics(classes),
                        tuple(data.texts or ()) if data.tensors is None else ())
    if isinstance(data, PairsData):
        texts, positions = distinct_texts([*data.first, *data.second])
        inputs = _encode(spec, texts, data)
        if spec.padding_mask is not None:  # the rows' order is free (pairs name them): by length, in windows
            order = windowed_length_order(inputs[spec.padding_mask].sum(dim=1))
            rank = torch.empty_like(order)
            rank[order] = torch.arange(len(order))
            inputs = tuple(t[order] for t in inputs)
            texts = [texts[i] for i in order.tolist()]
            positions = [int(rank[p]) for p in positions]
        count = len(data)
        metric = pairs_metric(positions[:count], positions[count:], data.scores, len(texts))
        return TaskRows(inputs, torch.arange(len(texts)), (metric,), tuple(texts))
    if isinstance(data, RetrievalData):
        relevance = torch.zeros(len(data.queries), len(data.corpus))
        for query, judged in enumerate(data.relevant):
            for document, gain in judged.items():
                relevance[query, document] = gain
        rows = len(data.queries) + len(data.corpus)
        corpus = (*data.queries, *data.corpus)
        return TaskRows(_encode(spec, corpus, data), torch.arange(rows),
                        retrieval_metrics(len(data.queries), relevance), corpus)
    raise TypeError(f"unknown task data {type(data).__name__}")


def against_reference(metric: Metric, reference: Callable[[], Tensor]) -> Metric:
    """``metric`` computed against the unoptimized model's outputs (not the task's targets)."""

    def compute(outputs: Tensor, _targets: Tensor) -> Tensor:
        return metric.compute(outputs, reference().to(outputs.device))

    return dataclasses.replace(metric, compute=compute, resampled=None)  # resamples read the targets


def with_task_data(spec: ModelSpec, data: TaskData, label_names: Sequence[str] = (),
                   batch_size: int = 32) -> ModelSpec:
    """``spec`` scored on ``data``: the task's metric, fidelity metrics as extras."""
    rows = task_rows(spec, data, label_names)
    targets = rows.targets
    batches = split_batches(rows.inputs, batch_size)
    if spec.padding_mask is not None:
        batches = [trim_to_longest(batch, spec.padding_mask) for batch in batches]
    labelled: list[LabelledBatch] = [
        (batch, targets[start : start + int(batch[0].shape[0])])
        for batch, start in zip(batches, range(0, int(targets.shape[0]), batch_size), strict=True)
    ]

    def reference() -> Tensor:
        return spec.unoptimized_outputs.of(batches)

    primary, *task_extras = rows.metrics
    # The data says what the outputs are: class logits for labels, embeddings for pairs and retrieval.
    kind = "logits" if isinstance(data, ClassificationData) else "embedding"
    fidelity = [*fidelity_metrics(kind), *([NEIGHBOUR_AGREEMENT] if kind == "embedding" else [])]
    taken = {m.name for m in rows.metrics}
    return dataclasses.replace(
        spec,
        evaluation=lambda: list(labelled),
        metric=primary,
        extra_metrics=(*task_extras, *(against_reference(m, reference) for m in dict.fromkeys(fidelity)
                                       if m.name not in taken)),
        output_kind=spec.output_kind if spec.output_kind != "auto" else kind,
        evaluation_texts=rows.texts,
        fidelity_floors=(),  # the spec's floors guarded its own scoring; the user's data replaces it
        caveat="",  # what the spec's own metric could not judge: the user's data judges it
        description=f"{spec.description}; scored on {data.task} data {data.source} ({len(data)} rows)",
    )
