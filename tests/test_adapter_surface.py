"""The adapters' public surface as a user meets it: names, types, exceptions.

A user script is type-checked with mypy (strict) as a user's CI would; the
exceptions a user may catch are all public.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "autothrottle"

USER_SCRIPT = """
    import aiohttp
    import httpx

    from autothrottle import Throttle, ThrottleTimeout
    from autothrottle.aiohttp import ThrottledSession, throttle_middleware
    from autothrottle.httpx import (
        AsyncThrottledClient,
        AsyncThrottledTransport,
        ThrottledClient,
        ThrottledTransport,
        ThrottlePoolTimeout,
    )


    async def crawl(throttle: Throttle) -> None:
        session: aiohttp.ClientSession = ThrottledSession(
            throttle=throttle, timeout=aiohttp.ClientTimeout(total=30)
        )
        async with session:
            if isinstance(session, ThrottledSession):
                await session.close()
        by_hand = aiohttp.ClientSession(middlewares=(throttle_middleware(throttle),))
        assert isinstance(by_hand, ThrottledSession)
        client: httpx.AsyncClient = AsyncThrottledClient(throttle=throttle, timeout=5.0)
        transport: httpx.AsyncBaseTransport = AsyncThrottledTransport(throttle=throttle)
        async with client, httpx.AsyncClient(transport=transport):
            try:
                await client.get("https://example.com/")
            except ThrottlePoolTimeout as error:
                reason: str = error.bound
                assert isinstance(error, (ThrottleTimeout, httpx.PoolTimeout)), reason


    def threads(throttle: Throttle) -> None:
        sync: httpx.Client = ThrottledClient(throttle=throttle, follow_redirects=True)
        plain = httpx.Client(transport=ThrottledTransport(throttle=throttle))
        with sync, plain:
            sync.get("https://example.com/")


    def mistakes(throttle: Throttle) -> None:
        ThrottledSession(throttle=throttle, timout=3)  # E: typo
        AsyncThrottledClient(throttle=throttle, transprt=None)  # E: typo
        ThrottledClient(throttle="slow")  # E: not a throttle
"""


def test_a_users_script_type_checks_and_its_mistakes_are_caught(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(USER_SCRIPT))
    # In a process of its own: run in the test's, mypy would leave its
    # collector thresholds (200,000 objects a collection) and some 600k
    # live objects to every later test of the worker.
    mypy = [sys.executable, "-m", "mypy", "--strict", "--no-incremental"]
    done = subprocess.run(
        [*mypy, "--cache-dir", str(tmp_path / "cache"), str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out, err = done.stdout, done.stderr
    flagged = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    expected = {
        number
        for number, line in enumerate(script.read_text().splitlines(), start=1)
        if line.endswith(("# E: typo", "# E: not a throttle"))
    }
    assert flagged == expected, out + err


def _exception_classes() -> list[tuple[str, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base) for base in node.bases}
                if any(b.endswith(("Error", "Exception", "Timeout")) for b in bases):
                    found.append((path.relative_to(PACKAGE).as_posix(), node.name))
    return found


def test_every_exception_class_a_user_may_catch_is_public() -> None:
    classes = _exception_classes()
    assert ("_httpx/_common.py", "ThrottlePoolTimeout") in classes
    assert [c for c in classes if c[1].startswith("_")] == []
