"""paretorch: the one import root, and the names for scripted reuse of the stages from Python.

::

    import paretorch

    digits = paretorch.resolve_spec("digits")          # any MODEL= form: a name, file.py:attr, model.pt2, hf:dir
    model = paretorch.load_model(digits)
    ctx = paretorch.StageContext(spec=digits, device="cpu")
    pruned = paretorch.apply_stage(model, paretorch.PruneConfig(ratio=0.3), ctx)
    chain = paretorch.run_chain(model, [paretorch.PruneConfig(ratio=0.3),
                                        paretorch.QuantizeConfig(method="int8_dynamic")], ctx)

Everything installed is under ``paretorch``: :mod:`paretorch.pipeline` (the core, engine, search and commands),
:mod:`paretorch.stages` (the built-in stages), :mod:`paretorch.experiments` (the built-in models, data and the
bench); :mod:`paretorch.extend` holds what a stage or runtime plugin imports and :mod:`paretorch.testing` the
contract tests a plugin runs. A ``pipeline.py``, ``stages/`` or ``experiments/`` of your own is never imported
in their place. ``python -m paretorch <command>`` is the ``paretorch`` command.

The names (:mod:`paretorch.api`, listed in its ``__all__``) load on first use: torch and the stages take
seconds to import, and ``python -m paretorch`` checks its arguments before that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paretorch.pipeline.core.version import VERSION as __version__  # noqa: F401 (paretorch.__version__)

if TYPE_CHECKING:
    from paretorch.api import *  # noqa: F403 (the names __getattr__ hands out, for type checkers)

def __getattr__(name: str) -> Any:
    """``paretorch.<name>``: the name from :mod:`paretorch.api`, imported on first use."""
    if name.startswith("_") and name != "__all__":
        raise AttributeError(f"module 'paretorch' has no attribute {name!r}")
    import paretorch.api as api  # lazy: `python -m paretorch` checks its arguments before torch loads

    if name == "__all__" or name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module 'paretorch' has no attribute {name!r} (its names: paretorch.api.__all__)")


def __dir__() -> list[str]:
    import paretorch.api as api  # lazy, as in __getattr__

    return sorted({*globals(), *api.__all__})
