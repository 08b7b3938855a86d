"""Issue 33 on a CUDA GPU, real MiniLM: the pack recipe's outputs across token buckets, and the padded-batch read.

    python -m paretorch.experiments.bench.pack_gpu_check OUT.json [--ab]

1. ``pack + amp stage bf16`` under ``compile_cudagraphs`` through :class:`paretorch.stages.pack.deploy.PackedEncoder`
   on the first 1, 3, 8 and 256 lists of the latency batch, against fp32 eager on the same lists padded:
   FlexAttention padded to whole blocks (:func:`paretorch.stages.pack.attention.flex_length`), then unpadded (the
   control: ``flex_length`` patched to the identity) on 1 and 8 lists.
2. ``--ab``: the device-padded b256 call, the shipped read (two integers, the starts built in the graph)
   against the one before it (the ``B`` lengths read, the starts built on the host and copied back), paired.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import Tensor, nn

import paretorch.stages.pack.attention as attention
from paretorch.experiments.bench.gpu_rows import FULL_BF16, padded_from_lists, staged, token_lists
from paretorch.experiments.bench.settings import BENCH_LATENCY
from paretorch.experiments.models.minilm import spec as minilm_spec
from paretorch.pipeline.core.padding import latency_sample, trim_to_longest
from paretorch.pipeline.core.paired import measure_paired
from paretorch.pipeline.core.runtimes.registry import prepare_runtime
from paretorch.pipeline.core.spec import move_batch
from paretorch.pipeline.core.timing import DeviceTimer
from paretorch.stages.pack.deploy import PackedEncoder
from paretorch.stages.pack.layout import attention_width, device_layout, input_index, packed_length, starts_of
from paretorch.stages.pack.packed import PackedBert
from paretorch.stages.pack.stage import PackConfig


def check(label: str, base: nn.Module, packed: PackedBert, lists: list[list[int]], cases: list[int]) -> list[dict]:
    """Max abs difference from fp32 eager of the packed encoder on the first ``rows`` lists, per case."""
    torch.compiler.reset()
    encoder = PackedEncoder(packed, encoder_device(packed), "compile_cudagraphs")
    rows = []
    for count in cases:
        part = lists[:count]
        ids, mask = padded_from_lists(part)
        with torch.no_grad():
            reference = base(ids.to(encoder.device), mask.to(encoder.device)).cpu()
        for _ in range(3):  # record, then replay
            out = encoder(part)
        real = sum(map(len, part))
        rows.append({"variant": label, "rows": count, "real": real, "tokens": packed_length(real, True, packed.buckets),
                     "max_abs_diff_vs_fp32": float((out - reference).abs().max())})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def encoder_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.compiler.disable
def old_host_starts(mask: Tensor, bucket: bool, buckets: tuple[int, ...]) -> tuple[Tensor, int, int]:
    """The read before this change: the ``B`` lengths to the host, the starts built there and copied back."""
    lengths = mask.ne(0).sum(dim=1).tolist()
    tokens = packed_length(sum(lengths), bucket, buckets)
    starts = torch.tensor(starts_of(lengths, tokens), dtype=torch.int64)
    return starts.to(mask.device, non_blocking=True), tokens, attention_width(max(lengths), bucket, buckets)


class OldRead(nn.Module):
    """``PackedBert.forward`` for a padded batch of several rows as it was before this change."""

    def __init__(self, packed: PackedBert) -> None:
        super().__init__()
        self.packed = packed

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        starts, tokens, width = old_host_starts(attention_mask, torch.compiler.is_compiling(), self.packed.buckets)
        layout = device_layout(starts, tokens, width)
        ids = input_ids.reshape(-1).index_select(0, input_index(layout, int(input_ids.shape[1])))
        return self.packed.head(self.packed.encode(ids, layout), layout)


def read_ab(packed: PackedBert, inputs: tuple[Tensor, ...]) -> dict[str, object]:
    """The shipped read over the old one on the same device-padded batch, paired (speed-up > 1: faster)."""
    device = inputs[0].device
    torch.compiler.reset()
    old = prepare_runtime(OldRead(packed), "compile_cudagraphs", device)
    new = prepare_runtime(packed, "compile_cudagraphs", device)
    with torch.no_grad():
        for _ in range(3):
            before = old(*inputs).float().clone()  # cloned: the next replay may reuse a graph's output memory
            after = new(*inputs).float().clone()
        paired = measure_paired((old, inputs), (new, inputs), DeviceTimer(device, BENCH_LATENCY), BENCH_LATENCY)
    return {"variant": "device padded b256: new read over old", "speedup": paired.speedup, "ci": list(paired.ci),
            "old_ms": paired.baseline_ms, "new_ms": paired.trial_ms,
            "old_vs_new_max_abs_diff": float((before - after).abs().max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--ab", action="store_true")
    args = parser.parse_args()
    cuda = torch.device("cuda")
    spec = minilm_spec()
    base = spec.build().to(cuda).eval()
    packed = staged(base, [PackConfig(), FULL_BF16], spec, cuda).to(cuda).eval()
    assert isinstance(packed, PackedBert) and spec.padding_mask is not None
    host = trim_to_longest(latency_sample(spec, 256), spec.padding_mask)
    lists = token_lists(host, spec.padding_mask)
    rows = check("flex padded to whole blocks", base, packed, lists, [1, 3, 8, 256])
    padded_length = attention.flex_length
    attention.flex_length = lambda tokens: tokens  # the control
    try:
        rows += check("flex unpadded (control)", base, packed, lists, [1, 8])
    finally:
        attention.flex_length = padded_length
    if args.ab:
        rows.append(read_ab(packed, move_batch(host, cuda)))
        print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
