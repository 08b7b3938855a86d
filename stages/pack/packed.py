"""The packed model: the same BERT modules run on the batch's real tokens only.

:class:`PackedBert` takes the wrapper's inputs (padded ``input_ids`` and ``attention_mask``) and
returns its output. It registers the wrapper's children under their own names (the same
``nn.Linear`` / ``nn.LayerNorm`` / ``nn.Embedding`` objects, so module names, state dict keys and
what pruning, quantization and mixed precision see are unchanged) and runs them on the packed
``(tokens, hidden)`` sequence: embeddings, the layers' linear layers, norms and activations
(their own ``forward``s), attention per sequence (:mod:`stages.pack.attention`), then the
wrapper's pooling or classifier. Pruned heads, FFN widths and layers are read from the modules.

Under ``torch.compile`` the packed length is bucketed (:mod:`stages.pack.buckets`), so compiled
graphs see static shapes; in eager mode it is the exact token count.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional

from stages.pack.attention import choose_kernel, packed_attention
from stages.pack.bert import PackablePaths
from stages.pack.buckets import TOKEN_BUCKETS
from stages.pack.layout import PackedLayout, pack_layout


class PackedBert(nn.Module):
    """A pipeline text wrapper around BERT, run padding-free (see the module docstring).

    ``attention``: ``auto`` (varlen Flash Attention where it runs, else ``padded``), ``varlen``,
    ``nested`` or ``padded`` (:func:`stages.pack.attention.choose_kernel`); ``buckets``: the
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

    def extra_repr(self) -> str:
        return f"packs={self.wrapped_type}, head={self.paths.head}, attention={self.attention}"

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        layout = pack_layout(attention_mask, torch.compiler.is_compiling(), self.buckets)
        hidden = self.encode(input_ids, attention_mask, layout)
        return self.head(hidden, attention_mask, layout)

    def encode(self, input_ids: Tensor, attention_mask: Tensor, layout: PackedLayout) -> Tensor:
        """The last hidden state of the packed tokens, ``(T, hidden)``."""
        bert: Any = self.get_submodule(self.paths.bert)
        embeddings: Any = bert.embeddings
        ids = input_ids.reshape(-1).index_select(0, layout.gather_index)
        positions = embeddings.position_ids.reshape(-1).index_select(0, layout.positions)
        types_buffer = getattr(embeddings, "token_type_ids", None)
        types = torch.zeros_like(ids) if types_buffer is None \
            else types_buffer.reshape(-1).index_select(0, layout.positions)
        hidden = embeddings.word_embeddings(ids) + embeddings.token_type_embeddings(types)
        hidden = hidden + embeddings.position_embeddings(positions)
        hidden = embeddings.dropout(embeddings.LayerNorm(hidden))
        tokens = hidden.shape[0]
        layer: Any
        for layer in bert.encoder.layer:
            attention = layer.attention.self
            size = attention.attention_head_size
            query = attention.query(hidden).view(tokens, -1, size)
            key = attention.key(hidden).view(tokens, -1, size)
            value = attention.value(hidden).view(tokens, -1, size)
            kind = choose_kernel(self.attention, query.device, query.dtype)
            scale = float(getattr(attention, "scaling", size ** -0.5))
            context = packed_attention(kind, query, key, value, layout, attention_mask, scale)
            hidden = layer.attention.output(context, hidden)
            hidden = layer.output(layer.intermediate(hidden), hidden)
        return hidden

    def head(self, hidden: Tensor, attention_mask: Tensor, layout: PackedLayout) -> Tensor:
        """The wrapper's output from the packed hidden states: pooled per row, or the classifier's logits."""
        rows = int(attention_mask.shape[0])
        if self.paths.head == "mean":  # as PooledEmbedding: the sum over real tokens / their count
            sums = hidden.new_zeros(rows + 1, hidden.shape[1]).index_add(0, layout.rows, hidden)[:rows]
            counts = attention_mask.to(hidden.dtype).sum(dim=1, keepdim=True).clamp_min(1e-9)
            pooled = sums / counts
        else:
            pooled = hidden.index_select(0, layout.first_tokens)
        if self.paths.head == "classifier":
            classifier: Any = self.get_submodule(self.paths.classifier)
            pooler = classifier.bert.pooler
            return classifier.classifier(classifier.dropout(pooler.activation(pooler.dense(pooled))))
        return functional.normalize(pooled, p=2, dim=1) if self.paths.normalize else pooled
