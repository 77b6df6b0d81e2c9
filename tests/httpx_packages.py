"""Run an httpx adapter test module against httpx and against httpx2.

The two packages share one API, and ``autothrottle.httpx2`` is generated from
``autothrottle.httpx``, so one test body serves both. A test module names
``httpx`` and the adapter's classes at module level, as a user would;
:func:`bind` rebinds those names to one package's for the duration of a test::

    @pytest.fixture(autouse=True, params=PACKAGES)
    def package(request, monkeypatch):
        return bind(globals(), request, monkeypatch)

Tests that need a tool made for httpx alone (respx patches httpx's own
httpcore) carry ``@pytest.mark.httpx_only`` and are skipped under httpx2.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

PACKAGES = ["httpx", "httpx2"]

#: Private names the tests reach, and the module of each (under ``_httpx`` or ``_httpx2``).
PRIVATE = {"_LeaseStream": "_async", "_WireTracer": "_async"}


def bind(names: dict[str, Any], request: pytest.FixtureRequest, monkeypatch: Any) -> str:
    package: str = request.param
    if package != "httpx" and request.node.get_closest_marker("httpx_only") is not None:
        pytest.skip("uses a tool made for httpx alone")
    client = pytest.importorskip(package)
    adapter = importlib.import_module(f"autothrottle.{package}")
    monkeypatch.setitem(names, "httpx", client)
    for name in adapter.__all__:
        if name in names:
            monkeypatch.setitem(names, name, getattr(adapter, name))
    for name, module in PRIVATE.items():
        if name in names:
            private = importlib.import_module(f"autothrottle._{package}.{module}")
            monkeypatch.setitem(names, name, getattr(private, name))
    return package
