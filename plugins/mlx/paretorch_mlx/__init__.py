"""paretorch's MLX runtime, a plugin package: the ``mlx`` runtime (:mod:`.runtime`) and the ``export.mlx`` stage it
reads (:mod:`.export`), each one entry-point line in this package's ``pyproject.toml``."""
