"""The machinery behind the prune stage (:mod:`paretorch.stages.prune`).

* :mod:`paretorch.stages.prune.model_checks`: find the output head, resolve protected
  layers, check that a pruned model still runs and keeps its output shapes.
* :mod:`paretorch.stages.prune.training`: recovery fine-tuning and the gradients that
  Taylor importance needs.
* :mod:`paretorch.stages.prune.structured`: channel pruning with torch-pruning's
  dependency graph.
* :mod:`paretorch.stages.prune.attention`: which projections hold attention heads, so
  that structured pruning removes whole heads.
* :mod:`paretorch.stages.prune.ffn`: which Linear layers open an FFN block, so that its
  intermediate width is pruned at its own ratio.
* :mod:`paretorch.stages.prune.depth`: removing whole residual blocks, chosen by their
  measured effect on the output.
* :mod:`paretorch.stages.prune.unstructured`: weight pruning with ``torch.nn.utils.prune``.
"""

from __future__ import annotations
