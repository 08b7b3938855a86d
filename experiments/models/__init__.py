"""The shipped model specs: one module per built-in ``MODEL=`` name, each with a ``spec``."""
