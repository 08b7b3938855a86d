"""The packed model: the same BERT modules run on the batch's real tokens only.

:class:`PackedBert` takes the wrapper's inputs (padded ``input_ids`` and ``attention_mask``) and
returns its output. It registers the wrapper's children under their own names (the same
``nn.Linear`` / ``nn.LayerNorm`` / ``nn.Embedding`` objects, so module names, state dict keys and
what pruning, quantization and mixed precision see are unchanged) and runs them on the packed
``(tokens, hidden)`` sequence: embeddings, the layers' linear layers, norms and activations
(their own ``forward``s), attention per sequence (:mod:`paretorch.stages.pack.attention`), then the
wrapper's pooling or classifier. Pruned heads, FFN widths and layers are read from the modules.

Two inputs: a padded batch (``forward``, the pipeline's interface: its token count is read once, a
one-row batch runs at its padded width with no read) and a batch packed on the host
(``forward_packed``: what :class:`paretorch.stages.pack.deploy.PackedEncoder` feeds it from token id lists, with
no read at all). Either way the index tensors are built on the device inside the call
(:func:`paretorch.stages.pack.layout.device_layout`). Under ``torch.compile`` the packed length is bucketed
(:mod:`paretorch.stages.pack.buckets`), so compiled graphs see static shapes; in eager mode it is the exact count.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional

from paretorch.stages.pack.attention import choose_kernel, document_blocks, packed_attention
from paretorch.stages.pack.bert import PackablePaths
from paretorch.stages.pack.buckets import TOKEN_BUCKETS
from paretorch.stages.pack.layout import (
    PackedLayout,
    device_layout,
    device_starts,
    host_sizes,
    input_index,
    single_row_starts,
)


class PackedBert(nn.Module):
    """A pipeline text wrapper around BERT, run padding-free (see the module docstring).

    ``attention``: ``auto`` (FlexAttention inside a compiled CUDA graph, else varlen Flash Attention where it
    runs, else ``padded``), ``varlen``, ``flex``, ``nested`` or ``padded``
    (:func:`paretorch.stages.pack.attention.choose_kernel`); ``buckets``: the
    total-token buckets used under ``torch.compile``."""

    def __init__(self, wrapper: nn.Module, paths: PackablePaths, attention: str = "auto",
                 buckets: tuple[int, ...] = TOKEN_BUCKETS) -> None:
        super().__init__()
        for name, child in wrapper.named_children():
            self.add_module(name, child)
        self.paths = paths
        self.attention = attention
        self.buckets = buckets
        self.wrapped_type = type(wrapper).__name__

    @property
    def max_length(self) -> int:
        """The longest token list the model takes (its position embeddings)."""
        bert: Any = self.get_submodule(self.paths.bert)
        return int(bert.embeddings.position_embeddings.num_embeddings)

    def extra_repr(self) -> str:
        return f"packs={self.wrapped_type}, head={self.paths.head}, attention={self.attention}"

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The wrapper's output for a padded ``(B, W)`` batch: its token count read to the host (:func:`host_sizes`),
        the layout and the packing built inside the graph. A one-row batch reads nothing: compiled, it runs the
        unpacked computation (:meth:`padded`); eager, the packed one at its padded width."""
        if int(input_ids.shape[0]) == 1:
            if torch.compiler.is_compiling():  # one row has nothing to skip: the unpacked graph, never slower
                return self.padded(input_ids, attention_mask)
            starts, tokens, width = single_row_starts(attention_mask)
        else:
            tokens, width = host_sizes(attention_mask, torch.compiler.is_compiling(), self.buckets)
            starts = device_starts(attention_mask.ne(0).sum(dim=1), tokens)  # in the graph: no copy back
        layout = device_layout(starts, tokens, width)
        ids = input_ids.reshape(-1).index_select(0, input_index(layout, int(input_ids.shape[1])))
        return self.head(self.encode(ids, layout), layout)

    def padded(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The wrapper's own computation on the padded batch (the same modules): what a one-row batch runs
        compiled (eager runs the packed path at the padded width: Hugging Face's mask handling reads the
        mask on the host there)."""
        if self.paths.head == "classifier":
            classifier: Any = self.get_submodule(self.paths.classifier)
            return classifier(input_ids=input_ids, attention_mask=attention_mask)[0]
        bert: Any = self.get_submodule(self.paths.bert)
        hidden = bert(input_ids=input_ids, attention_mask=attention_mask)[0]
        if self.paths.head == "cls":
            pooled = hidden[:, 0]
        else:  # as PooledEmbedding: the sum over real tokens / their count
            keep = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1e-9)
        return functional.normalize(pooled, p=2, dim=1) if self.paths.normalize else pooled

    def forward_packed(self, buffer: Tensor, tokens: int, width: int) -> Tensor:
        """The wrapper's output for a batch packed on the host (:func:`paretorch.stages.pack.layout.pack_token_lists`:
        ``[ids (T), sequence starts (B + 2)]``, ``T`` and the attention width): no host read, the layout
        built inside the graph."""
        layout = device_layout(buffer[tokens:], tokens, width)
        return self.head(self.encode(buffer[:tokens], layout), layout)

    def encode(self, ids: Tensor, layout: PackedLayout) -> Tensor:
        """The last hidden state of the packed tokens ``ids`` (``(T,)``), ``(T, hidden)``."""
        bert: Any = self.get_submodule(self.paths.bert)
        embeddings: Any = bert.embeddings
        positions = embeddings.position_ids.reshape(-1).index_select(0, layout.positions)
        types_buffer = getattr(embeddings, "token_type_ids", None)
        types = torch.zeros_like(ids) if types_buffer is None \
            else types_buffer.reshape(-1).index_select(0, layout.positions)
        hidden = embeddings.word_embeddings(ids) + embeddings.token_type_embeddings(types)
        hidden = hidden + embeddings.position_embeddings(positions)
        hidden = embeddings.dropout(embeddings.LayerNorm(hidden))
        tokens = hidden.shape[0]
        flex = self.attention in ("auto", "flex") and choose_kernel(self.attention, ids.device, hidden.dtype) == "flex"
        blocks = document_blocks(layout) if flex else None  # one mask for every layer
        layer: Any
        for layer in bert.encoder.layer:
            attention = layer.attention.self
            size = attention.attention_head_size
            query = attention.query(hidden).view(tokens, -1, size)
            key = attention.key(hidden).view(tokens, -1, size)
            value = attention.value(hidden).view(tokens, -1, size)
            scale = float(getattr(attention, "scaling", size ** -0.5))
            context = packed_attention(choose_kernel(self.attention, query.device, query.dtype), query, key, value,
                                       layout, scale, blocks)
            hidden = layer.attention.output(context, hidden)
            hidden = layer.output(layer.intermediate(hidden), hidden)
        return hidden

    def head(self, hidden: Tensor, layout: PackedLayout) -> Tensor:
        """The wrapper's output from the packed hidden states: pooled per row, or the classifier's logits."""
        rows = int(layout.lengths.shape[0])
        if self.paths.head == "mean":  # as PooledEmbedding: the sum over real tokens / their count
            # Summed in float32 (more exact), and compiled the sum fuses into the last layer norm's kernel (a bf16
            # index_add is a separate atomic kernel: 28 us against 11 us for the fused one on an H200, b256)
            sums = hidden.new_zeros(rows + 1, hidden.shape[1], dtype=torch.float32).index_add(
                0, layout.rows, hidden.float())[:rows]
            pooled = (sums / layout.lengths.float().unsqueeze(1).clamp_min(1e-9)).to(hidden.dtype)
        else:
            pooled = hidden.index_select(0, layout.first_tokens)
        if self.paths.head == "classifier":
            classifier: Any = self.get_submodule(self.paths.classifier)
            pooler = classifier.bert.pooler
            return classifier.classifier(classifier.dropout(pooler.activation(pooler.dense(pooled))))
        return functional.normalize(pooled, p=2, dim=1) if self.paths.normalize else pooled
