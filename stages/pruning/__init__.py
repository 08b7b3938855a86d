"""The machinery behind the prune stage (:mod:`stages.prune`).

* :mod:`stages.pruning.model_checks`: find the output head, resolve protected
  layers, check that a pruned model still runs and keeps its output shapes.
* :mod:`stages.pruning.training`: recovery fine-tuning and the gradients that
  Taylor importance needs.
* :mod:`stages.pruning.structured`: channel pruning with torch-pruning's
  dependency graph.
* :mod:`stages.pruning.attention`: which projections hold attention heads, so
  that structured pruning removes whole heads.
* :mod:`stages.pruning.unstructured`: weight pruning with ``torch.nn.utils.prune``.
"""

from __future__ import annotations
