"""paretorch's MLX runtime, a plugin package: the ``mlx`` runtime (:mod:`.runtime`) and the ``export.mlx`` stage it
reads (:mod:`.export`), each one entry-point line in this package's ``pyproject.toml``. Like any plugin it imports
paretorch through :mod:`paretorch.extend` alone, and its tests (``tests/test_contract.py``) subclass
:mod:`paretorch.testing`'s contracts."""
