"""The installed paretorch's version (``paretorch --version``, ``paretorch.__version__``), from its metadata."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("paretorch")
except PackageNotFoundError:  # a source tree on sys.path without an install: no metadata to read
    VERSION = "0+unknown"
