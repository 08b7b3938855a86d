"""The built-in stages, one package each: :mod:`stages.prune`, :mod:`stages.quantize`,
:mod:`stages.amp` and :mod:`stages.export` (Core ML, ONNX, ``.pt2``), plus helpers they
share in :mod:`stages.common`.

Every stage module ends with ``STAGE = Stage(...)`` (see :mod:`pipeline.core.stage`) and
is declared once in ``pyproject.toml`` under ``[project.entry-points."paretorch.stages"]``;
the registry finds it there. Importing this package registers nothing.
"""
