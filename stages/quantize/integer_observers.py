"""The x86 inductor quantizer of torchao's PT2E flow, observing floating-point tensors only.

torchao's :class:`X86InductorQuantizer` annotates every ``aten.mul.Tensor`` of two same-shaped tensors (and every
``aten.matmul``) whatever their dtype. An encoder that computes integers with them, as MPNet, RoBERTa and XLM-R
number their positions (``mask * cumsum(mask)`` on int32 token masks), then gets a histogram observer on an integer
tensor, and calibration fails with ``"histogram_cpu" not implemented for 'Int'``. An integer tensor has no scale to
observe: :class:`FloatX86Quantizer` drops the annotations of every integer (or boolean) input and output after the
quantizer's own, so that such an op runs as it came and every float op is quantized as before.

Imported when a static quantization runs (it imports torchao's quantizer, which the stage does not need to load).
"""

from __future__ import annotations

import torch
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation
from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer


def observable(node: object) -> bool:
    """Whether ``node``'s value can have an activation observer: a floating-point tensor (its fake value from
    ``torch.export``); a value of unknown type counts as one, as the quantizer would have it."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return not isinstance(value, torch.Tensor) or value.dtype.is_floating_point


def unobserve_integers(model: torch.fx.GraphModule) -> list[str]:
    """Remove every annotation of ``model`` that would observe an integer or boolean tensor (an input of an
    annotated op, or its output); returns the ops that lost one, in graph order."""
    changed: list[str] = []
    for node in model.graph.nodes:
        annotation = node.meta.get(Q_ANNOTATION_KEY)
        if not isinstance(annotation, QuantizationAnnotation):
            continue
        integers = [source for source in annotation.input_qspec_map if not observable(source)]
        for source in integers:
            del annotation.input_qspec_map[source]
        output = annotation.output_qspec is not None and not observable(node)
        if output:
            annotation.output_qspec = None
        if integers or output:
            changed.append(node.name)
    return changed


class FloatX86Quantizer(X86InductorQuantizer):
    """:class:`X86InductorQuantizer` that leaves integer tensors unobserved (:func:`unobserve_integers`); the ops
    it left are :attr:`integer_ops` after ``prepare_pt2e``."""

    def __init__(self) -> None:
        super().__init__()
        self.integer_ops: list[str] = []

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        model = super().annotate(model)
        self.integer_ops = unobserve_integers(model)
        return model
