"""A packed model a deployment runs: token id lists in, embeddings out, with no host read inside the call.

Input contract of :class:`PackedEncoder` (the model a pack recipe builds, ``run_chain(...).model``, under the
recipe's runtime; the pack stage's ``deploy``: ``pipeline apply`` writes the files it is rebuilt from and
:func:`paretorch.pipeline.api.load_deployment` rebuilds it):

* ``encoder(token_lists)``: ``B`` lists of token ids, each the tokenizer's ``input_ids`` for one text
  **without padding** (``[CLS] ... [SEP]`` for BERT; ``tokenizer(texts)["input_ids"]`` hands exactly
  this over), each 1 to ``encoder.max_length`` ids long;
* ``encoder.padded(input_ids, attention_mask)``: a right-padded batch on the host (``(B, W)`` CPU
  tensors, mask non-zero = token), as ``tokenizer(texts, padding=True, return_tensors="pt")`` gives it.

Both return the wrapper's output, one row per text (embeddings, or logits for a classifier), as a
``(B, dim)`` float32 CPU tensor. Per call: the ids and sequence starts are packed on the host into
one int64 buffer (:func:`paretorch.stages.pack.layout.pack_token_lists`), copied to the device once, run as
one graph per token bucket under a compiled runtime (the layout is built inside it:
:meth:`PackedBert.forward_packed <paretorch.stages.pack.packed.PackedBert.forward_packed>`), and the output is
copied back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.length_groups import check_token_lists
from paretorch.pipeline.core.runtimes.base import Runtime
from paretorch.pipeline.core.runtimes.registry import (
    available_runtimes,
    get_runtime,
    prepare_runtime,
    registered_runtimes,
)
from paretorch.pipeline.core.text_batches import TextBatches
from paretorch.stages.pack.layout import HostPacked, pack_padded, pack_token_lists
from paretorch.stages.pack.packed import PackedBert


def runs_packed(runtime: Runtime) -> bool:
    """Whether ``runtime`` runs the packed torch module, as it declares: it runs the torch module itself (a runtime
    of a file deploys that file, called per length group: :func:`paretorch.pipeline.api.load_deployment`), and
    compiles either not at all or per static shape (token buckets); one that compiles for dynamic shapes marks the
    sequence dim of token inputs, which the packed buffer does not have."""
    return runtime.runs_torch_module() and (runtime.static_shapes or not runtime.compiles)


def deploy_runtimes() -> tuple[str, ...]:
    """The registered runtimes a pack recipe deploys under (:func:`runs_packed`)."""
    return tuple(name for name, runtime in registered_runtimes().items() if runs_packed(runtime))


class PackedTokens(nn.Module):
    """``forward(buffer, tokens, width)``: a :class:`PackedBert` fed a host-packed batch (what a runtime
    compiles for :class:`PackedEncoder`)."""

    def __init__(self, packed: PackedBert) -> None:
        super().__init__()
        self.packed = packed

    def forward(self, buffer: Tensor, tokens: int, width: int) -> Tensor:
        return self.packed.forward_packed(buffer, tokens, width)


class PackedEncoder(TextBatches):
    """A pack recipe's model as a deployment calls it (the module docstring has the input contract).

    ``model``: the recipe's model (a :class:`PackedBert`, e.g. ``run_chain(model, recipe.stages, ctx).model``);
    ``runtime``: the recipe's runtime (one of :func:`deploy_runtimes`). Strings in: :meth:`~TextBatches.encode` (a
    corpus sorted by length, tokenized a batch ahead, rows in input order) once ``encode_text`` is set, as
    :func:`paretorch.pipeline.api.load_deployment` does."""

    def __init__(self, model: nn.Module, device: torch.device | str, runtime: str = "eager") -> None:
        if not isinstance(model, PackedBert):
            raise TypeError(f"PackedEncoder runs a pack recipe's model (a PackedBert), got a {type(model).__name__}: "
                            "apply a recipe with the pack stage first")
        self.device = torch.device(device)
        if not runs_packed(get_runtime(runtime)):
            raise ValueError(f"PackedEncoder runs under {', '.join(deploy_runtimes())}; {runtime!r} is not one of "
                             "them (a runtime of a file deploys its file: paretorch.pipeline.api.load_deployment)")
        if runtime not in available_runtimes(self.device):
            raise ValueError(f"runtime {runtime!r} does not run on {self.device.type} here: use eager")
        self.model = model.to(self.device).eval()
        self.runtime = runtime
        #: Static-shape runtimes compile one graph per token bucket; eager runs the exact count.
        self.bucket = get_runtime(runtime).static_shapes
        self.fn: Callable[..., Tensor] = prepare_runtime(PackedTokens(self.model), runtime, self.device)
        #: The longest token list the model takes (its position embeddings).
        self.max_length = self.model.max_length

    def __call__(self, token_lists: Sequence[Sequence[int]]) -> Tensor:
        """One output row per list of token ids, ``(B, dim)`` float32 on the host."""
        check_token_lists(token_lists, self.max_length)
        return self.run(pack_token_lists(token_lists, self.bucket, self.model.buckets))

    def padded(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """One output row per row of a right-padded host batch, ``(B, dim)`` float32 on the host."""
        return self.run(pack_padded(input_ids, attention_mask, self.bucket, self.model.buckets))

    def prepare(self, input_ids: Tensor, attention_mask: Tensor) -> HostPacked:
        """The host packing of a right-padded batch (what ``encode`` does ahead, beside the model)."""
        return pack_padded(input_ids, attention_mask, self.bucket, self.model.buckets)

    def run_prepared(self, prepared: HostPacked) -> Tensor:
        return self.run(prepared)

    def run(self, packed: HostPacked) -> Tensor:
        """The output of a batch packed on the host: one copy in, one graph, one copy out."""
        buffer = packed.buffer.to(self.device, non_blocking=True)
        with torch.inference_mode():
            return self.fn(buffer, packed.tokens, packed.width).to("cpu", torch.float32)
