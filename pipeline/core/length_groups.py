"""A padded sequence model's file called once per group of similar-length rows: packing for runtimes that run a file.

torch's ``pack`` stage drops a batch's padding inside the model; an exported graph (ONNX, OpenVINO IR) cannot: it
computes every padding token. The same saving is open at the *call*: sort the batch's rows by length, cut them into
groups of about :data:`ROWS_PER_GROUP` rows, trim each group to its own longest row, call the file once per group
and put the per-row outputs back in the batch's order. Padding is masked, so the outputs change only by the kernels'
rounding at other shapes (and, under dynamic int8, by the scales each call computes from its own rows).

A runtime that runs a file (``onnxruntime``, ``openvino``) reproduces a pack recipe this way: the export records
which input is the padding mask (:attr:`~paretorch.pipeline.core.stage_context.ExportResult.grouped_mask_input`) and the
runtime wraps the file it opened (:func:`length_grouped`); the search times and scores that call, and a deployment
(:class:`GroupedEncoder`, built by :func:`paretorch.pipeline.api.load_deployment`) calls the file the same way. Per-row
outputs only: an output that mixes rows (a batch statistic) would change; embeddings and logits do not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from paretorch.pipeline.core.errors import InfeasibleConfig
from paretorch.pipeline.core.padding import cut_to, longest
from paretorch.pipeline.core.spec import Batch
from paretorch.pipeline.core.text_batches import TextBatches

#: The stage whose padding-free execution these calls reproduce (what a runtime declares in ``Reproduces.stages``).
PACK = "pack"
#: Rows per length group (a batch of 32: 4 calls). Measured on MiniLM at b32, one AVX-512 thread: 4 groups beat
#: 2 and 8 under OpenVINO int8 and ONNX Runtime dynamic int8 (docs/benchmarks.md, "Length-grouped calls").
ROWS_PER_GROUP = 8


def length_order(mask: Tensor) -> Tensor:
    """The rows of a padding ``mask`` (non-zero = token) from shortest to longest (stable)."""
    return torch.argsort(mask.ne(0).sum(dim=1), stable=True)


def groups_of(order: Tensor, rows: int = ROWS_PER_GROUP) -> list[Tensor]:
    """``order`` cut into consecutive groups of ``rows`` rows (the last may be shorter); one group for a batch of
    ``rows`` rows or fewer."""
    if rows < 1:
        raise ValueError(f"a length group needs at least one row, got {rows}")
    return list(torch.split(order, rows))


def grouped_outputs(call: Callable[[Batch], list[Tensor]], inputs: Batch, mask_index: int,
                    rows: int = ROWS_PER_GROUP) -> list[Tensor]:
    """Every output of ``call`` on ``inputs``, called once per length group, each group trimmed to its longest row,
    rows put back in the batch's order (outputs must have one row per input row)."""
    order = length_order(inputs[mask_index])
    parts: list[list[Tensor]] = []
    for group_rows in groups_of(order, rows):
        group = tuple(t[group_rows] for t in inputs)
        outputs = call(cut_to(group, longest(group, mask_index), mask_index))
        if any(out.dim() == 0 or int(out.shape[0]) != len(group_rows) for out in outputs):
            shapes = ", ".join(str(tuple(out.shape)) for out in outputs)
            raise InfeasibleConfig(f"length-grouped calls need one output row per input row: {len(group_rows)} rows "
                                   f"gave outputs of shape {shapes} (pack reproduces pooled or per-row outputs only)")
        parts.append(outputs)
    restore = torch.argsort(order).to(parts[0][0].device)
    return [torch.cat(outputs)[restore] for outputs in zip(*parts, strict=True)]


class LengthGrouped:
    """A :class:`~paretorch.pipeline.core.runtimes.base.LoadedModel` called once per length group (see the module)."""

    def __init__(self, loaded: Callable[..., Tensor], mask_index: int, rows: int = ROWS_PER_GROUP) -> None:
        self.loaded = loaded
        self.mask_index = mask_index
        self.rows = rows

    def __call__(self, *inputs: Tensor) -> Tensor:
        return grouped_outputs(lambda batch: [self.loaded(*batch)], inputs, self.mask_index, self.rows)[0]

    def outputs(self, inputs: Batch) -> list[Tensor]:
        outputs: Callable[[Batch], list[Tensor]] = getattr(self.loaded, "outputs")  # noqa: B009 (LoadedModel)
        return grouped_outputs(outputs, inputs, self.mask_index, self.rows)

    def describe(self) -> str:
        inner = self.loaded.describe() if hasattr(self.loaded, "describe") else type(self.loaded).__name__
        return f"{inner}; called per length group of {self.rows} rows (pack)"


def length_grouped(loaded: Callable[..., Tensor], mask_index: int | None) -> Callable[..., Tensor]:
    """``loaded`` called per length group when its export says so (``mask_index``: the padding mask input), else
    ``loaded`` itself."""
    return loaded if mask_index is None else LengthGrouped(loaded, mask_index)


def check_token_lists(token_lists: Sequence[Sequence[int]], max_length: int) -> None:
    """One clear error for token id lists a deployment cannot take (none, or one empty or over ``max_length``)."""
    if not token_lists or any(not 1 <= len(ids) <= max_length for ids in token_lists):
        raise ValueError(f"give one or more token id lists of 1 to {max_length} ids each "
                         "(a tokenizer's input_ids, without padding)")


class GroupedEncoder(TextBatches):
    """A pack recipe's exported file as a deployment calls it, with
    :class:`paretorch.stages.pack.deploy.PackedEncoder`'s contract: ``encoder(token_lists)`` (token id lists without
    padding, each 1 to ``max_length`` ids) or ``encoder.padded(input_ids, attention_mask)`` (a right-padded host batch);
    one ``(B, dim)`` float32 host row per text. The file takes ``(input_ids, attention_mask)`` and runs per length group
    (``grouped``). Strings in:
    :meth:`~paretorch.pipeline.core.text_batches.TextBatches.encode`, once ``encode_text`` is set."""

    def __init__(self, grouped: LengthGrouped, max_length: int, pad_id: int = 0) -> None:
        if grouped.mask_index != 1:
            raise ValueError("GroupedEncoder feeds (input_ids, attention_mask): the padding mask must be input 1, "
                             f"this file's is input {grouped.mask_index}")
        self.fn = grouped
        self.max_length = max_length
        self.pad_id = pad_id

    def __call__(self, token_lists: Sequence[Sequence[int]]) -> Tensor:
        """One output row per list of token ids, ``(B, dim)`` float32 on the host."""
        check_token_lists(token_lists, self.max_length)
        width = max(len(ids) for ids in token_lists)
        input_ids = torch.full((len(token_lists), width), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(token_lists), width), dtype=torch.int64)
        for row, ids in enumerate(token_lists):
            input_ids[row, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.int64)
            mask[row, : len(ids)] = 1
        return self.padded(input_ids, mask)

    def padded(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """One output row per row of a right-padded host batch, ``(B, dim)`` float32 on the host."""
        with torch.inference_mode():
            return self.fn(input_ids.to(torch.int64), attention_mask.to(torch.int64)).to("cpu", torch.float32)
