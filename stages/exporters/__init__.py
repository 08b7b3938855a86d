"""The machinery of the export stages (``stages/export.py`` holds the configs).

* :mod:`.atomic`: write an artifact into a staging directory, move it into place
  only once it is complete and validated.
* :mod:`.upstream`: read the recipe before the export (prune / quantize / amp
  configs) as the compression the export mirrors.
* :mod:`.checks`: model selection, output comparison, converter errors.
* :mod:`.metadata`: the recipe and library versions stored in every artifact.
* :mod:`.coreml_export`, :mod:`.coreml_compress`, :mod:`.onnx_export`,
  :mod:`.pt2_export`: one exporter each.
"""
