"""Helpers of the quantize stage (:mod:`paretorch.stages.quantize`): which layers to quantize,
the torchao ``quantize_`` methods, and the static PT2E flow."""
