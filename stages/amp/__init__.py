"""The machinery behind the amp stage (:mod:`paretorch.stages.amp`).

* :mod:`paretorch.stages.amp.casting`: the casts that make a policy persist in the
  model (the model boundary's replaced forward, input casts per layer).
* :mod:`paretorch.stages.amp.units`: which layers a policy is made of, and which
  ones must stay float32 (protected, already quantized, tied weights).
* :mod:`paretorch.stages.amp.switch`: sets any policy on a model in place, as often
  as calibration needs, without losing the float32 weights; every layer reduced
  is exactly a whole-model cast.
* the output error against float32, the per-layer sensitivities and the greedy
  choice of float32 layers are the shared :mod:`paretorch.stages.common.sensitivity`.
"""

from __future__ import annotations
