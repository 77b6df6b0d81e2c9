"""The package's version: the one place it is written, which hatch reads to build
the package (``[tool.hatch.version]`` in pyproject.toml). A constant, not the
installed metadata: reading that costs ``import autothrottle`` importlib.metadata."""

__version__ = "0.1.0"
