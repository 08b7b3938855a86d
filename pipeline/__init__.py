"""paretorch's engine: model specs, devices, evaluation, the DAG runner, search, tracking and the CLI."""
