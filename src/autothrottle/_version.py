"""The package version, read from the installed metadata: pyproject.toml is the one source."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("autothrottle")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
