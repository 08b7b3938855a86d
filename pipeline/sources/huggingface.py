"""Local Hugging Face directories: ``MODEL=hf:path/to/dir`` with ``--inputs-file lines.txt``.

Loaded offline with ``transformers`` (``HF_HUB_OFFLINE=1``, ``local_files_only``):

* a sequence-classification checkpoint (``config.json`` architectures ending in
  ``ForSequenceClassification``) -> its logits; fidelity by top-1 agreement;
* anything else -> ``AutoModel`` plus pooling of the last hidden state: mean
  over real tokens (or the CLS token when a sentence-transformers
  ``1_Pooling/config.json`` says so), L2-normalized when the directory's
  ``modules.json`` lists a ``Normalize`` module; fidelity by mean cosine.

The pipeline's model is ``forward(input_ids, attention_mask) -> tensor``; inputs
are int64 token ids padded to :data:`SEQUENCE_LENGTH`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache, partial
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy
import torch
from torch import Tensor, nn

from paretorch.pipeline.core.errors import SpecError
from paretorch.pipeline.core.fidelity import fidelity_spec
from paretorch.pipeline.core.paired import usable_cores
from paretorch.pipeline.core.spec import Batch, ModelSpec
from paretorch.pipeline.core.user_files import hf_directory, hf_needs_inputs, require_hf_directory
from paretorch.pipeline.sources.archive import one_line
from paretorch.pipeline.sources.inputs import read_text_inputs, split_batches, tile

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

SEQUENCE_LENGTH = 128
#: Index of the attention mask in the ``(input_ids, attention_mask)`` inputs (``ModelSpec.padding_mask``).
ATTENTION_MASK_INPUT = 1
MAX_CALIBRATION_LINES = 64


def set_offline() -> None:
    """Make sure nothing in transformers / huggingface_hub reaches for the network
    (and that loading prints no progress bars); call before loading anything."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


class PooledEmbedding(nn.Module):
    """An encoder plus pooling: ``forward(input_ids, attention_mask) -> (batch, hidden)`` embeddings.

    An encoder's own ``pooler`` (BERT's dense + tanh on the CLS token) is unused and removed."""

    def __init__(self, encoder: nn.Module, pooling: str = "mean", normalize: bool = False) -> None:
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"unknown pooling '{pooling}': choose mean or cls")
        if isinstance(getattr(encoder, "pooler", None), nn.Module):
            # BERT-style encoders compute a pooled CLS output that this pooling never reads:
            # drop it, so that no time is spent on it and no stage prunes or quantizes it.
            encoder.pooler = None  # type: ignore[assignment]
        self.encoder = encoder
        self.pooling = pooling
        self.normalize = normalize

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:  # mean over real tokens, as the sentence-transformers model cards define it
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1e-9)
        if self.normalize:
            pooled = nn.functional.normalize(pooled, p=2, dim=1)
        return pooled


class ClassifierLogits(nn.Module):
    """A sequence-classification model: ``forward(input_ids, attention_mask) -> (batch, classes)`` logits."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.classifier(input_ids=input_ids, attention_mask=attention_mask)[0]


@dataclass(frozen=True)
class HFLayout:
    """What a local directory holds and how its output is formed."""

    directory: Path
    classifier: bool
    pooling: str
    normalize: bool


def inspect_directory(directory: Path) -> HFLayout:
    """Check a local HF directory and read how to pool its output (no weights loaded)."""
    require_hf_directory(directory)  # a directory that holds config.json
    config_path = directory / "config.json"
    config = _read_json(config_path)
    architectures = config.get("architectures") or []
    classifier = any(str(a).endswith("ForSequenceClassification") for a in architectures)
    pooling, normalize = "mean", False
    modules_path = directory / "modules.json"
    if modules_path.is_file():
        modules = _read_json(modules_path)
        if isinstance(modules, list):
            types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
            normalize = any(t.endswith(".Normalize") for t in types)
            pooling_path = next(
                (directory / str(m.get("path", "")) / "config.json" for m in modules
                 if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling")),
                None,
            )
            if pooling_path is not None and pooling_path.is_file():
                pooling = "cls" if _read_json(pooling_path).get("pooling_mode_cls_token") else "mean"
    return HFLayout(directory=directory, classifier=classifier, pooling=pooling, normalize=normalize)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read {path}: {exc}") from exc


def load_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """The directory's tokenizer, offline."""
    set_offline()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a broken directory
        raise SpecError(f"hf:{directory}: cannot load a tokenizer from it ({one_line(exc)})") from exc


def load_hf_model(layout: HFLayout) -> nn.Module:
    """The directory's model in eval mode, wrapped so that ``forward(input_ids, attention_mask)`` returns one tensor."""
    set_offline()
    from transformers import AutoModel, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if layout.classifier else AutoModel
    try:
        model = auto.from_pretrained(str(layout.directory), local_files_only=True)
    except Exception as exc:  # missing weights, unknown architecture, corrupt files
        raise SpecError(f"hf:{layout.directory}: cannot load the model ({one_line(exc)})") from exc
    wrapped = ClassifierLogits(model) if layout.classifier else PooledEmbedding(model, layout.pooling, layout.normalize)
    return wrapped.eval()


def tokenize(tokenizer: PreTrainedTokenizerBase, texts: list[str], sequence_length: int = SEQUENCE_LENGTH) -> Batch:
    """``(input_ids, attention_mask)`` as int64, padded and truncated to ``sequence_length``."""
    encoded = tokenizer(
        texts, padding="max_length", truncation=True, max_length=sequence_length, return_tensors="pt"
    )
    return (encoded["input_ids"].to(torch.int64), encoded["attention_mask"].to(torch.int64))


def encode_texts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_tokens: int = SEQUENCE_LENGTH) -> Batch:
    """Texts as one batch padded to its longest text (at most ``max_tokens``), as a user's serving code
    pads: labelled data is scored at its own lengths, not at the longest the model takes. A fast tokenizer runs
    its Rust batch call directly (:class:`PaddedBatches`: the same ids and mask, without transformers' per-call
    setup and list-to-tensor conversion)."""
    return PaddedBatches.of(tokenizer, max_tokens)(texts)


class PaddedBatches:
    """``texts -> (input_ids, attention_mask)`` int64, padded to the batch's longest text, truncated to
    ``max_tokens``: what ``tokenizer(texts, padding="longest", truncation=True, max_length=max_tokens)`` returns.
    For a fast tokenizer padded on the right, its own copy of the Rust backend, truncation set once and no padding,
    runs ``encode_batch_fast`` (no character offsets; the GIL released: a large batch in chunks on up to
    :data:`MAX_WORKERS` threads, as many as the CPUs this process may use), and the unpadded ids become one padded
    array with the mask read from their lengths (fewer Python ints than padded ids and mask: the part that holds the
    GIL). On the H200 host's 16 cores, 256 pydoc sentences: 3.0 ms against 6.0 ms padded in the backend; 256 dev
    sentences 2.3 against 3.3 ms. Any other tokenizer is called as above. Built once per tokenizer and length
    (:meth:`of`)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.backend: Tokenizer | None = None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if (backend is not None and getattr(tokenizer, "padding_side", "right") == "right"
                and getattr(tokenizer, "pad_token_id", None) is not None):
            from tokenizers import Tokenizer

            own = Tokenizer.from_str(backend.to_str())
            own.enable_truncation(max_tokens, direction=getattr(tokenizer, "truncation_side", "right"))
            own.no_padding()  # padded here, from the lengths
            self.backend = own
            self._encode_batch = getattr(own, "encode_batch_fast", own.encode_batch)  # tokenizers < 0.21: no fast

    @classmethod
    @cache
    def of(cls, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> PaddedBatches:
        return cls(tokenizer, max_tokens)

    def __call__(self, texts: Sequence[str]) -> Batch:
        if self.backend is None:
            encoded = self.tokenizer(list(texts), padding="longest", truncation=True, max_length=self.max_tokens,
                                     return_tensors="pt")
            return (encoded["input_ids"].to(torch.int64), encoded["attention_mask"].to(torch.int64))
        texts = list(texts)
        workers = tokenizer_workers(len(texts))
        if workers == 1:
            parts = [self._encode_batch(texts)]
        else:  # the Rust call releases the GIL: chunks on a few cores at once
            step = -(-len(texts) // workers)
            parts = list(_pool().map(self._encode_batch, [texts[i : i + step] for i in range(0, len(texts), step)]))
        rows = [encoding.ids for part in parts for encoding in part]
        lengths = numpy.fromiter(map(len, rows), dtype=numpy.int64, count=len(rows))
        width = int(lengths.max()) if len(rows) else 0
        present = numpy.arange(width)[None, :] < lengths[:, None]
        ids = numpy.full((len(rows), width), self.tokenizer.pad_token_id, dtype=numpy.int64)
        ids[present] = numpy.fromiter(chain.from_iterable(rows), dtype=numpy.int64, count=int(lengths.sum()))
        mask = present.astype(numpy.int64)
        return torch.from_numpy(ids), torch.from_numpy(mask)


#: Texts per tokenizer worker at least: below it, one call (a thread's hand-off costs more than it saves).
TEXTS_PER_WORKER = 64
#: Tokenizer workers at most.
MAX_WORKERS = 8


def tokenizer_workers(count: int) -> int:
    """How many threads tokenize ``count`` texts: one per :data:`TEXTS_PER_WORKER` texts, at most the CPUs this
    process may use and :data:`MAX_WORKERS` (a process pinned to one core: one)."""
    return max(1, min(MAX_WORKERS, usable_cores(), count // TEXTS_PER_WORKER))


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="paretorch-token-chunks")


def max_tokens(directory: Path) -> int:
    """The longest input a user's sentence-transformers code feeds (``sentence_bert_config.json``
    ``max_seq_length``), else :data:`SEQUENCE_LENGTH`."""
    config_path = directory / "sentence_bert_config.json"
    if config_path.is_file():
        length = _read_json(config_path).get("max_seq_length")
        if isinstance(length, int) and length > 0:
            return length
    return SEQUENCE_LENGTH


def label_names(directory: Path) -> tuple[str, ...]:
    """A classifier's class names in index order (``config.json`` ``id2label``), or () when it has none."""
    id2label = _read_json(directory / "config.json").get("id2label") or {}
    try:
        ordered = sorted((int(index), str(name)) for index, name in id2label.items())
    except (AttributeError, ValueError):
        return ()
    return tuple(name for _, name in ordered)


def hf_spec(ref: str, inputs_file: str | None = None, output_kind: str = "auto",
            eval_texts: Sequence[str] | None = None) -> ModelSpec:
    """A fidelity spec for ``hf:path/to/dir``; ``inputs_file`` is a text file, one input per line
    (without it, the texts of ``--eval-data``: ``eval_texts``).

    The last quarter of the lines (at most :data:`MAX_CALIBRATION_LINES`) is for
    calibration, the rest for evaluation.
    """
    directory = hf_directory(ref)
    layout = inspect_directory(directory)
    if not inputs_file and not eval_texts:
        raise hf_needs_inputs(directory)
    lines = read_text_inputs(inputs_file) if inputs_file else list(dict.fromkeys(eval_texts or ()))
    calibration_count = max(1, min(MAX_CALIBRATION_LINES, len(lines) // 4))
    evaluation_lines, calibration_lines = lines[:-calibration_count], lines[-calibration_count:]
    tokenizer = load_tokenizer(directory)
    load_hf_model(layout)  # a directory whose weights cannot load fails here, before any search

    @cache
    def tokens(split: str) -> Batch:
        return tokenize(tokenizer, evaluation_lines if split == "evaluation" else calibration_lines)

    if output_kind == "auto":
        output_kind = "logits" if layout.classifier else "embedding"
    return fidelity_spec(
        name=directory.name or "hf_model",
        build=lambda: load_hf_model(layout),
        example_inputs=lambda batch_size: tile(tokens("evaluation"), batch_size),
        calibration=lambda: split_batches(tokens("calibration")),
        evaluation_inputs=lambda: split_batches(tokens("evaluation")),
        output_kind=output_kind,
        padding_mask=ATTENTION_MASK_INPUT if getattr(tokenizer, "padding_side", "right") == "right" else None,
        encode_text=partial(encode_texts, tokenizer, max_tokens=max_tokens(directory)),
        latency_texts=lambda: evaluation_lines,
        label_names=label_names(directory) if layout.classifier else (),
        description=(
            f"Hugging Face model from {directory} ({'classifier logits' if layout.classifier else layout.pooling}"
            f"-pooled embeddings), fidelity on {len(evaluation_lines)} lines of "
            f"{inputs_file or 'the --eval-data texts'}"
        ),
    )
