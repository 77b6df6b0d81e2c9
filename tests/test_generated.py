"""The generated adapter modules are what ``scripts/unasync.py`` makes of their source.

The sync httpx adapter and the whole httpx2 adapter are generated from the
async httpx adapter (one source, as httpcore and hishel do it); an edit to a
generated module, or a source edited without rerunning the script, fails here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "unasync.py"


def _unasync() -> object:
    spec = importlib.util.spec_from_file_location("unasync_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_generated_module_is_current() -> None:
    pytest.importorskip("ruff")
    unasync: object = _unasync()
    stale = unasync.stale()  # type: ignore[attr-defined]
    assert stale == [], f"run python scripts/unasync.py: {stale}"


def test_the_sync_rules_turn_async_code_into_its_sync_twin() -> None:
    unasync: object = _unasync()
    source = (
        "async def handle_async_request(self) -> AsyncIterator[bytes]:\n"
        "    lease = await self._throttle.acquire(key)\n"
        "    async with httpx.AsyncClient() as client:  # unasync: with httpx.Client() as c:\n"
        "        await self.exchange.on_wire()  # unasync: -\n"
        "    return an :class:`AsyncThrottledTransport`\n"
    )
    assert unasync.to_sync(source) == (  # type: ignore[attr-defined]
        "def handle_request(self) -> Iterator[bytes]:\n"
        "    lease = self._throttle.acquire_blocking(key)\n"
        "    with httpx.Client() as c:\n"
        "    return a :class:`ThrottledTransport`\n"
    )
