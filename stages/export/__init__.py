"""The export stages, one module each: :mod:`.coreml` (``export.coreml``), :mod:`.onnx`
(``export.onnx``) and :mod:`.pt2` (``export.pt2``), and their shared machinery:

* :mod:`.atomic`: write an artifact into a staging directory, move it into place
  only once it is complete and validated.
* :mod:`.checks`: model selection, output comparison, converter errors.
* :mod:`.metadata`: the recipe and library versions stored in every artifact.
* :mod:`.layer_filter`: which weights the mirrored compression touches.
* :mod:`.coreml_export`, :mod:`.coreml_convert`, :mod:`.coreml_compress`,
  :mod:`.onnx_export`, :mod:`.pt2_export`: one exporter each.

What to mirror comes from :func:`paretorch.pipeline.core.stage.export_mirror` (each model
stage declares its own mirror); no exporter imports another stage.
"""
