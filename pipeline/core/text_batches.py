"""Strings in, outputs out, for a whole corpus: what a deployed text encoder's ``encode`` does.

:class:`TextBatches` is the base of the deployments' encoders (:class:`paretorch.stages.pack.deploy.PackedEncoder`,
:class:`paretorch.pipeline.core.length_groups.GroupedEncoder`, and :class:`ModelEncoder`: any model prepared for its
runtime, what a deployment of a recipe without a deploying stage runs and what the search's workload times,
:mod:`paretorch.pipeline.core.workload`). Given the model's text encoder (the spec's ``encode_text``: its
fast tokenizer's batch call, padded to each batch's longest text; :func:`paretorch.pipeline.api.load_deployment` sets
it),
:meth:`TextBatches.encode`:

* sorts the corpus by length, longest first (characters, as sentence-transformers' ``encode`` does), so each batch
  pads little, and returns one output row per input **in the input's order**;
* does a batch's host work ahead in a worker thread while the model runs the current one: tokenizing it and the
  encoder's :meth:`TextBatches.prepare` (a pack deployment packs it on the host there), so the main thread only
  copies it in, runs the model and copies the outputs back (the fast tokenizer and torch's waits release the GIL),
  and a batch costs about the longer of the two, not their sum. That needs a core the model
  does not use: by default (``overlap=None``) it is on when the model runs on an accelerator, or when the process
  may use more CPUs than torch's threads; on a process pinned to as many cores as torch uses, the worker would take
  the model's core (one pinned thread, MiniLM, 2,910 sentences: 13.5 s overlapped against 11.6 s without,
  ``experiments/bench/corpus.py``);
* copies each batch's outputs to the host as float32;
* on an accelerator, runs with one torch CPU thread for the call (restored after): the host's torch work there is
  a batch's padding and copies, and torch's idle intra-op threads spin on the cores the tokenizer's threads need
  (H200 host, 16 cores, MiniLM pack + bf16 + CUDA graphs, batches of 256: 6.53 ms a batch at 16 torch threads,
  4.17 ms at one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from paretorch.pipeline.core.errors import ConfigError
from paretorch.pipeline.core.padding import bucket_length, longest, pad_to, trim_to_longest
from paretorch.pipeline.core.paired import usable_cores
from paretorch.pipeline.core.spec import Batch, move_batch

#: Texts per batch when the caller does not say (sentence-transformers' default).
BATCH_SIZE = 32


class TextBatches:
    """The ``encode`` of a deployed encoder whose ``padded(input_ids, attention_mask)`` runs one host batch."""

    #: texts -> the model's ``(input_ids, attention_mask)`` host batch, padded to its longest text (None: unknown).
    encode_text: Callable[[Sequence[str]], Batch] | None = None
    #: Where the model runs (an encoder on an accelerator sets its own).
    device: torch.device = torch.device("cpu")

    def overlap_pays(self) -> bool:
        """Whether tokenizing ahead can run beside the model: it runs on an accelerator, or the process may use
        more CPUs than torch's threads (:func:`paretorch.pipeline.core.paired.usable_cores`)."""
        return self.device.type != "cpu" or usable_cores() > torch.get_num_threads()

    @contextmanager
    def host_threads(self) -> Iterator[None]:
        """torch's CPU threads for an :meth:`encode` call: one on an accelerator (the host's torch work is padding
        and copies; idle intra-op threads spin on the tokenizer's cores), the caller's setting on the CPU."""
        threads = torch.get_num_threads()
        if self.device.type != "cpu" and threads > 1:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)

    def padded(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        raise NotImplementedError

    def prepare(self, input_ids: Tensor, attention_mask: Tensor) -> Any:
        """A tokenized host batch's host work before the device (packing it, trimming it): what :meth:`encode` does
        ahead in its worker, beside the model. The default: the batch as it is, for :meth:`run_prepared`."""
        return input_ids, attention_mask

    def run_prepared(self, prepared: Any) -> Tensor:
        """One batch that :meth:`prepare` made through the model: ``(B, dim)`` float32 on the host."""
        return self.padded(*prepared)

    def encode(self, texts: Sequence[str], batch_size: int = BATCH_SIZE, *, sort: bool = True,
               overlap: bool | None = None) -> Tensor:
        """One ``(len(texts), dim)`` float32 host row per text, in the order given. ``sort``: batch the texts
        longest first (off: in the order given); ``overlap``: tokenize the next batch while the model runs (None:
        where it pays, :meth:`overlap_pays`)."""
        if self.encode_text is None:
            raise ConfigError("this encoder has no tokenizer: load it with "
                              "paretorch.pipeline.api.load_deployment(folder, spec), "
                              "whose spec sets encode_text")
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts, not one string: encode([text])")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        texts = list(texts)
        if not texts:
            raise ValueError("encode needs at least one text")
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i])) if sort else list(range(len(texts)))
        chunks = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
        encode_text = self.encode_text
        if overlap is None:
            overlap = self.overlap_pays()

        def prepared(chunk: list[int]) -> Any:  # all of a batch's host work: tokenized, then prepared
            batch = encode_text([texts[i] for i in chunk])
            return self.prepare(batch[0], batch[1])

        with self.host_threads():
            if overlap and len(chunks) > 1:
                outputs = self.run_ahead(prepared, chunks)
            else:
                outputs = [self.run_prepared(prepared(chunk)) for chunk in chunks]
        ordered = torch.cat(outputs)
        result = torch.empty_like(ordered)
        result[torch.tensor(order)] = ordered
        return result


    def run_ahead(self, prepared: Callable[[list[int]], Any], chunks: list[list[int]]) -> list[Tensor]:
        """Each chunk's outputs, its host work (``prepared``) done in a worker while the model runs the one before."""
        outputs: list[Tensor] = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="paretorch-tokenize") as pool:
            ahead = pool.submit(prepared, chunks[0])
            for number in range(len(chunks)):
                batch = ahead.result()
                if number + 1 < len(chunks):
                    ahead = pool.submit(prepared, chunks[number + 1])
                outputs.append(self.run_prepared(batch))
        return outputs


def to_host(output: object) -> Tensor:
    """A model's output as a float32 host tensor (the first tensor of a tuple or list)."""
    if isinstance(output, (tuple, list)):
        output = output[0]
    if not isinstance(output, Tensor):
        raise TypeError(f"the model returned {type(output).__name__}, not a tensor")
    return output.to("cpu", torch.float32)


class ModelEncoder(TextBatches):
    """A model prepared for its runtime (``fn``), called on host batches: each moved to ``device``, a padded
    sequence batch (``mask_index``: its padding mask input) cut to its longest sample, or padded to its length
    bucket under a static-shape runtime (:mod:`paretorch.pipeline.core.padding`), and its output copied to the host as
    float32. ``encoder(*host_inputs)`` runs one batch; ``encoder.encode(texts)`` strings (with ``encode_text``)."""

    def __init__(self, fn: Callable[..., object], device: torch.device, mask_index: int | None = None,
                 static_shapes: bool = False, encode_text: Callable[[Sequence[str]], Batch] | None = None) -> None:
        self.fn = fn
        self.device = device
        self.mask_index = mask_index
        self.static_shapes = static_shapes
        self.encode_text = encode_text

    def __call__(self, *inputs: Tensor) -> Tensor:
        return self.run_prepared(self.shaped(tuple(inputs)))

    def shaped(self, batch: Batch) -> Batch:
        """A host batch as the runtime takes it: cut to its longest sample, or padded to its length bucket."""
        if self.mask_index is None:
            return batch
        index = self.mask_index
        return (pad_to(batch, bucket_length(longest(batch, index)), index) if self.static_shapes
                else trim_to_longest(batch, index))

    def padded(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self(input_ids, attention_mask)

    def prepare(self, input_ids: Tensor, attention_mask: Tensor) -> Batch:
        return self.shaped((input_ids, attention_mask))

    def run_prepared(self, prepared: Batch) -> Tensor:
        with torch.inference_mode():
            return to_host(self.fn(*move_batch(prepared, self.device)))
