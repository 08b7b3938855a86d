"""What the search times: the user's raw inputs to outputs on the host, the way the model will be used.

A user does not call the model on a batch already on the device: a text model gets strings, another model host
tensors, and its outputs are read on the host. :data:`WORKLOADS` names how the model is used (``--workload``):

* ``serve``: requests as they arrive, in the given order: :data:`SERVE_BATCHES` consecutive batches of the objective
  batch size, each from its raw inputs (a text model: the spec's ``encode_text``, its fast tokenizer's batch call,
  padded to the batch's longest text; else the host tensors, cut to their longest sample) through the model to
  float32 outputs on the host. The next batch is tokenized while the model runs the current one where that pays
  (:meth:`paretorch.pipeline.core.text_batches.TextBatches.overlap_pays`). The default.
* ``corpus``: one list of up to :data:`CORPUS_ROWS` inputs encoded whole, sorted by length, in batches of the
  objective batch size, the outputs back in input order: throughput.
* ``model``: the model call alone, on the latency batch already on the device (the figure beside the others).

The texts are the spec's ``latency_texts`` (the texts its latency sample tokenizes; ``--eval-data`` makes them the
user's own). Every side of a paired measurement (the baseline and each trial) runs the same :class:`Workload` through
:meth:`Workload.timed`, a deployment's ``encode`` the same code
(:class:`~paretorch.pipeline.core.text_batches.TextBatches`), so a search's speed-up and a timed
``load_deployment(...).encode`` are one measurement of one path. Timed on the host clock: the outputs end on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.names import WORKLOADS
from paretorch.pipeline.core.padding import SAMPLE_ROWS
from paretorch.pipeline.core.spec import Batch, ModelSpec, split_batches, tile
from paretorch.pipeline.core.text_batches import ModelEncoder

DEFAULT_WORKLOAD = WORKLOADS[0]
#: Consecutive batches one ``serve`` measurement runs (a stream, so that tokenizing ahead can overlap).
SERVE_BATCHES = 4
#: The most inputs one ``corpus`` measurement encodes.
CORPUS_ROWS = 1024


@dataclass(frozen=True)
class Workload:
    """One way of using the model, with its raw inputs: ``texts`` for a text model, else host ``rows``."""

    name: str
    batch_size: int
    texts: tuple[str, ...] = ()
    rows: Batch = ()
    #: The index of the rows' padding mask (a sequence model given as tensors), else None.
    mask_index: int | None = None

    @property
    def items(self) -> int:
        """Inputs one measurement runs."""
        return len(self.texts) if self.texts else (int(self.rows[0].shape[0]) if self.rows else 0)

    @property
    def batches(self) -> int:
        """Batches one measurement runs (its milliseconds per batch: a call's over this)."""
        return max(1, -(-self.items // self.batch_size))

    def describe(self) -> str:
        """``serve: 4 batches of 32 strings in the given order, tokenized, to host outputs``."""
        what = "string(s)" if self.texts else "input(s) as host tensors"
        if self.name == "serve":
            return (f"serve: {self.batches} batches of {self.batch_size} {what} in the given order, "
                    f"{'tokenized, ' if self.texts else ''}to host outputs")
        return (f"corpus: {self.items} {what} sorted by length, in batches of {self.batch_size}, "
                f"{'tokenized, ' if self.texts else ''}to host outputs")

    def timed(self, fn: Callable[..., object], device: torch.device, encode_text: Callable[[Sequence[str]], Batch]
              | None, static_shapes: bool) -> Callable[[], Tensor]:
        """``fn`` (a model prepared for its runtime) as this workload: a call runs it once, raw inputs to host
        outputs in input order."""
        sort = self.name == "corpus"
        if self.texts:
            if encode_text is None:
                raise ConfigError("a workload of texts needs the spec's encode_text (its tokenizer)")
            texts, batch_size = list(self.texts), self.batch_size
            encoder = ModelEncoder(fn, device, 1, static_shapes, encode_text)
            return lambda: encoder.encode(texts, batch_size, sort=sort)
        encoder = ModelEncoder(fn, device, self.mask_index, static_shapes)
        rows = self.rows
        if sort and self.mask_index is not None:  # longest first, as a text corpus is
            order = torch.argsort(rows[self.mask_index].ne(0).sum(dim=1), descending=True, stable=True)
            rows = tuple(t[order] for t in rows)
        batches = split_batches(rows, self.batch_size)
        return lambda: torch.cat([encoder(*batch) for batch in batches])


def workload_for(name: str, spec: ModelSpec, batch_size: int) -> Workload | None:
    """The workload ``name`` of ``spec`` at ``batch_size`` (None for ``model``: the model call alone)."""
    if name not in WORKLOADS:
        raise ConfigError(f"--workload {name}: choose one of {', '.join(WORKLOADS)}")
    if name == "model":
        return None
    count = SERVE_BATCHES * batch_size if name == "serve" else CORPUS_ROWS
    texts = tuple(spec.latency_texts()) if spec.latency_texts is not None and spec.encode_text is not None else ()
    if texts:
        chosen = texts[:count] if name == "corpus" else tuple((texts * -(-count // len(texts)))[:count])
        return Workload(name, batch_size, texts=chosen)
    wanted = count if name == "serve" else max(SAMPLE_ROWS, count // 4, batch_size)
    rows = spec.example_inputs(wanted)
    if int(rows[0].shape[0]) < wanted:  # a spec that gives fewer rows than asked: repeat them
        rows = tile(rows, wanted)
    return Workload(name, batch_size, rows=tuple(t.contiguous() for t in rows), mask_index=spec.padding_mask)
