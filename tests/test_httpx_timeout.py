"""A throttled client's default timeout reaches httpcore as the fields it reads.

A throttled client given no timeout keeps httpx's default, marked
(``_common.DefaultTimeout``), so that its pool timeout does not bound the wait
for the turn. Its per-request copy is made by name: exactly the fields
httpcore reads of the ``timeout`` extension, found here in the installed
httpcore's source, never an attribute a later httpx adds to its ``Timeout``
(which would ride along to every request unchecked), and none dropped.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from autothrottle import Throttle

PACKAGES = [("httpx", "httpcore"), ("httpx2", "httpcore2")]

_READ = re.compile(r"(\w+) = request\.extensions\.get\(\s*[\"']timeout[\"']")


def _fields_read(core: str) -> set[str]:
    """The keys of the ``timeout`` extension that ``core``'s source reads."""
    spec = importlib.util.find_spec(core)
    assert spec is not None and spec.submodule_search_locations
    fields: set[str] = set()
    readers = 0
    for root in spec.submodule_search_locations:
        for path in Path(root).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for name in set(_READ.findall(text)):
                readers += 1
                keys = rf"\b{re.escape(name)}(?:\.get\(\s*|\[\s*)[\"'](\w+)[\"']"
                fields.update(re.findall(keys, text))
    assert readers, f"no read of the timeout extension found in {core}: the scan is out of date"
    return fields


def _modules(package: str) -> tuple[Any, Any]:
    http = pytest.importorskip(package)
    return http, importlib.import_module(f"autothrottle._{package}._common")


@pytest.mark.parametrize(("package", "core"), PACKAGES)
def test_the_copy_holds_exactly_the_fields_httpcore_reads(package: str, core: str) -> None:
    http, common = _modules(package)
    pytest.importorskip(core)
    timeout = common.DefaultTimeout(http.Timeout(5.0, connect=1.0, pool=2.0))
    copied = timeout.as_dict()
    assert type(copied) is common.DefaultTimeoutDict
    fields = _fields_read(core)
    assert fields == {"connect", "read", "write", "pool"}
    assert set(copied) == fields
    assert copied == {"connect": 1.0, "read": 5.0, "write": 5.0, "pool": 2.0}
    # httpx's own copy, unmarked, is the same: the mark changes nothing httpcore reads.
    assert copied == http.Timeout(5.0, connect=1.0, pool=2.0).as_dict()


@pytest.mark.parametrize("package", ["httpx", "httpx2"])
def test_an_attribute_a_later_httpx_adds_is_not_copied(package: str) -> None:
    http, common = _modules(package)
    timeout = common.DefaultTimeout(http.Timeout(5.0))
    timeout.retries = 3  # a field httpcore knows nothing of
    timeout.__dict__["_cache"] = {}
    copied = timeout.as_dict()
    assert set(copied) == {"connect", "read", "write", "pool"}
    assert copied == http.Timeout(5.0).as_dict()


@pytest.mark.parametrize("package", ["httpx", "httpx2"])
async def test_a_throttled_clients_request_carries_the_marked_copy(package: str) -> None:
    http, common = _modules(package)
    adapter = importlib.import_module(f"autothrottle.{package}")
    async with adapter.AsyncThrottledClient(throttle=Throttle()) as client:
        request = client.build_request("GET", "http://127.0.0.1/")
    timeout = request.extensions["timeout"]
    assert type(timeout) is common.DefaultTimeoutDict
    assert timeout == http.Timeout(5.0).as_dict()
    # A timeout given is a choice: httpx's own copy, unmarked.
    with adapter.ThrottledClient(throttle=Throttle(), timeout=3.0) as chosen:
        request = chosen.build_request("GET", "http://127.0.0.1/")
    assert type(request.extensions["timeout"]) is dict
    assert request.extensions["timeout"] == http.Timeout(3.0).as_dict()
