"""How a trial's model is run: one module per runtime behind one small interface (:mod:`.base`).

The registry (:mod:`.registry`) finds them through the ``paretorch.runtimes`` entry-point group; adding a runtime
is one module and one entry-point line (in ``pyproject.toml``, or a plugin package's own).
"""
