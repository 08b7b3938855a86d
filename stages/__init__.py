"""The built-in stages, one package each: :mod:`paretorch.stages.prune`, :mod:`paretorch.stages.quantize`,
:mod:`paretorch.stages.amp` and :mod:`paretorch.stages.export` (Core ML, ONNX, ``.pt2``), plus helpers they
share in :mod:`paretorch.stages.common`.

Every stage module ends with ``STAGE = Stage(...)`` (see :mod:`paretorch.pipeline.core.stage`) and
is declared once in ``pyproject.toml`` under ``[project.entry-points."paretorch.stages"]``;
the registry finds it there. Importing this package registers nothing.
"""
