"""What a packable model is: a Hugging Face BERT encoder behind the pipeline's text wrappers.

The pipeline's text models take ``(input_ids, attention_mask)`` and return one tensor per row
(:mod:`paretorch.pipeline.sources.huggingface`): ``PooledEmbedding`` (mean or CLS pooling of an encoder,
optionally L2-normalized; MiniLM and ``hf:`` embedding directories) or ``ClassifierLogits``
(a ``...ForSequenceClassification`` model's logits). The stage packs those whose encoder is
BERT's: ``embeddings`` (word + token type + absolute position by column, then LayerNorm)
and ``encoder.layer[i]`` with ``attention.self.{query,key,value}``, ``attention.output``,
``intermediate`` and ``output``. Heads, FFN widths and depth may be pruned: the packed
model reads them from the modules at run time. Stages cannot import the sources layer, so the
wrappers are recognized by class name and attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

#: Embedding classes whose position ids are the token's column (RoBERTa's count real tokens instead).
ABSOLUTE_EMBEDDINGS = ("BertEmbeddings",)
#: The mask input of the pipeline's text wrappers: ``forward(input_ids, attention_mask)``.
MASK_INPUT = 1

Head = Literal["mean", "cls", "classifier"]


@dataclass(frozen=True)
class PackablePaths:
    """Where the packable parts of a model are (module names), and how its output is formed."""

    #: The BERT model (``embeddings`` + ``encoder``) inside the wrapper.
    bert: str
    #: ``mean`` / ``cls``: pooled hidden states (``PooledEmbedding``); ``classifier``: BERT's pooler,
    #: dropout and classifier on the CLS token (``ClassifierLogits``).
    head: Head
    #: L2-normalize the pooled output (``PooledEmbedding(normalize=True)``).
    normalize: bool
    #: The classifier module (``ClassifierLogits.classifier``), for ``head="classifier"``.
    classifier: str = ""


def find_packable(model: nn.Module) -> PackablePaths | str:
    """Where ``model``'s BERT parts are, or why the stage cannot pack it (one sentence)."""
    if isinstance(model, torch.jit.ScriptModule):
        return "the model is TorchScript: packing rewrites how a Python BERT module runs"
    kind = type(model).__name__
    pooling, classifier = getattr(model, "pooling", None), getattr(model, "classifier", None)
    if kind == "PooledEmbedding" and pooling in ("mean", "cls"):
        paths = PackablePaths("encoder", pooling, bool(getattr(model, "normalize", False)))
    elif kind == "ClassifierLogits" and isinstance(classifier, nn.Module):
        paths = PackablePaths("classifier.bert", "classifier", False, "classifier")
        problem = _classifier_problem(classifier)
        if problem is not None:
            return problem
    else:
        return (f"packing knows the pipeline's Hugging Face text wrappers (PooledEmbedding, ClassifierLogits) "
                f"around a BERT encoder; this model is a {kind}")
    try:
        bert = model.get_submodule(paths.bert)
    except AttributeError:
        return f"the {kind} holds no module '{paths.bert}'"
    problem = bert_problem(bert)
    return paths if problem is None else problem


def _classifier_problem(classifier: nn.Module) -> str | None:
    if not all(isinstance(getattr(classifier, name, None), nn.Module) for name in ("bert", "dropout", "classifier")):
        return (f"packing knows BERT sequence classifiers (bert, dropout, classifier); this one is a "
                f"{type(classifier).__name__}")
    pooler = getattr(classifier.bert, "pooler", None)
    if not all(isinstance(getattr(pooler, name, None), nn.Module) for name in ("dense", "activation")):
        return "the classifier's BERT has no pooler (dense + activation on the CLS token)"
    return None


def bert_problem(bert: nn.Module) -> str | None:
    """Why ``bert`` is not a BERT encoder the packed model can run (None: it is)."""
    config = getattr(bert, "config", None)
    if config is None:
        return f"the encoder ({type(bert).__name__}) has no Hugging Face config"
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "the encoder is a decoder (causal or cross attention): packing handles bidirectional encoders"
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return f"the encoder uses {config.position_embedding_type} position embeddings; packing handles absolute ones"
    embeddings = getattr(bert, "embeddings", None)
    if type(embeddings).__name__ not in ABSOLUTE_EMBEDDINGS:
        return (f"packing knows BERT's embeddings ({', '.join(ABSOLUTE_EMBEDDINGS)}: positions by column); "
                f"this encoder's are {type(embeddings).__name__}")
    layers = getattr(getattr(bert, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList):
        return "the encoder has no encoder.layer list"
    for index, layer in enumerate(layers):
        problem = _layer_problem(layer)
        if problem is not None:
            return f"encoder layer {index}: {problem}"
    return None


def _layer_problem(layer: nn.Module) -> str | None:
    if hasattr(layer, "crossattention"):
        return "it has cross attention"
    attention = getattr(layer, "attention", None)
    self_attention = getattr(attention, "self", None)
    for name in ("query", "key", "value"):
        if not isinstance(getattr(self_attention, name, None), nn.Module):
            return f"attention.self.{name} is missing"
    if not isinstance(getattr(self_attention, "attention_head_size", None), int):
        return "attention.self has no attention_head_size"
    for name in ("attention.output", "intermediate", "output"):
        if not _has(layer, name):
            return f"{name} is missing"
    return None


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True
