"""paretorch: the one import name for scripted reuse of the stages from Python.

::

    import paretorch

    digits = paretorch.resolve_spec("digits")          # any MODEL= form: a name, file.py:attr, model.pt2, hf:dir
    model = paretorch.load_model(digits)
    ctx = paretorch.StageContext(spec=digits, device="cpu")
    pruned = paretorch.apply_stage(model, paretorch.PruneConfig(ratio=0.3), ctx)
    chain = paretorch.run_chain(model, [paretorch.PruneConfig(ratio=0.3),
                                        paretorch.QuantizeConfig(method="int8_dynamic")], ctx)

The project's code lives in the top-level packages ``pipeline``, ``stages`` and ``experiments``;
importing ``paretorch`` first imports those three from beside it (:mod:`paretorch._home`), so a
``pipeline.py``, ``stages/`` or ``experiments/`` of your own in the working directory or the script's
folder changes nothing. ``python -m paretorch <command>`` is the ``paretorch`` command.

The names (:mod:`paretorch.api`, listed in its ``__all__``) load on first use: torch and the stages take
seconds to import, and ``python -m paretorch`` checks its arguments before that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paretorch._home import claim

if TYPE_CHECKING:
    from paretorch.api import *  # noqa: F403 (the names __getattr__ hands out, for type checkers)

claim()


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
