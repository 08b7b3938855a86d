"""How a trial's model runs: one module per runtime behind one small interface (:mod:`.base`).

The registry (:mod:`.registry`) lists them; adding a runtime is one module and one line there.
"""
