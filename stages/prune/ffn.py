"""Feed-forward (MLP) blocks for structured pruning: which Linear layers open an FFN.

A transformer's FFN is ``Linear(hidden -> intermediate) -> activation -> Linear(intermediate
-> hidden)``. Its intermediate width is one dependency group in torch-pruning, rooted at the
first Linear's output channels, so the FFN ratio is given per first Linear
(``pruning_ratio_dict``) and FFN pruning is switched off by ignoring those layers.

Found by two conventions:

* Hugging Face BERT-style layers: a module with ``intermediate.dense`` and
  ``output.dense`` Linear children (BERT, MiniLM, RoBERTa, ...), or ``fc1`` / ``fc2``
  Linear children (ViT-style MLPs), where the first one's width feeds the second;
* generic MLPs: ``Linear, activation (and dropout)..., Linear`` in an ``nn.Sequential``.
"""

from __future__ import annotations

from torch import nn

#: Modules allowed between the two Linear layers of a generic ``nn.Sequential`` MLP.
BETWEEN: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.LeakyReLU,
    nn.Hardswish,
    nn.Mish,
    nn.Dropout,
)


def ffn_input_layers(model: nn.Module) -> list[nn.Linear]:
    """The first Linear of every FFN block of ``model`` (whose outputs are the intermediate width), in order."""
    found: list[nn.Linear] = []
    for module in model.modules():
        pair = _named_pair(module)
        if pair is not None:
            found.append(pair[0])
        elif isinstance(module, nn.Sequential):
            found.extend(_sequential_firsts(module))
    unique: dict[int, nn.Linear] = {id(layer): layer for layer in found}
    return list(unique.values())


def ffn_widths(model: nn.Module, layers: list[nn.Linear]) -> dict[str, int]:
    """{FFN first Linear name: intermediate width} for ``layers`` (after pruning)."""
    names = {module: name for name, module in model.named_modules()}
    return {names[layer]: layer.out_features for layer in layers if layer in names}


def sync_intermediate_size(model: nn.Module, widths: dict[str, int]) -> int | None:
    """Set ``config.intermediate_size`` of every Hugging Face config in ``model`` to the FFN
    width, when all FFN blocks kept the same width; returns that width (None: widths differ
    or the model has no such config)."""
    if len(set(widths.values())) != 1:
        return None
    width = next(iter(widths.values()))
    updated = False
    for module in model.modules():
        config = getattr(module, "config", None)
        if isinstance(getattr(config, "intermediate_size", None), int):
            config.intermediate_size = width  # type: ignore[union-attr]
            updated = True
    return width if updated else None


def _named_pair(module: nn.Module) -> tuple[nn.Linear, nn.Linear] | None:
    intermediate, output = getattr(module, "intermediate", None), getattr(module, "output", None)
    first, second = getattr(intermediate, "dense", None), getattr(output, "dense", None)
    if not isinstance(first, nn.Linear) or not isinstance(second, nn.Linear):
        first, second = getattr(module, "fc1", None), getattr(module, "fc2", None)
    if isinstance(first, nn.Linear) and isinstance(second, nn.Linear) and first.out_features == second.in_features:
        return first, second
    return None


def _sequential_firsts(sequence: nn.Sequential) -> list[nn.Linear]:
    children = list(sequence)
    firsts = []
    for i, first in enumerate(children):
        if not isinstance(first, nn.Linear):
            continue
        j = i + 1
        while j < len(children) and isinstance(children[j], BETWEEN):
            j += 1
        second = children[j] if j < len(children) else None
        if j > i + 1 and isinstance(second, nn.Linear) and second.in_features == first.out_features:
            firsts.append(first)
    return firsts
