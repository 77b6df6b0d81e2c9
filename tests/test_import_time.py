"""What ``import autothrottle`` loads: the library, not the fleet's machinery.

A fleet (a store shared through Redis) is what few throttles have; its
modules load when a throttle is given a store other than the memory one
(``_parts``), never at import: they cost the import about a third of the
library's own time. Run in a fresh interpreter, where nothing was imported yet.
"""

from __future__ import annotations

import json
import subprocess
import sys

#: Modules only a fleet needs.
FLEET_ONLY = (
    "autothrottle._fleet",
    "autothrottle._fleet_wire",
    "autothrottle._fleet_turns",
    "autothrottle.redis",
    "redis",
)


def loaded(code: str, names: tuple[str, ...] = FLEET_ONLY) -> list[str]:
    """The modules of ``names`` loaded after ``code`` ran in a fresh interpreter."""
    listed = f"sorted(set({names!r}) & set(sys.modules))"
    check = f"{code}\nimport json, sys\nprint(json.dumps({listed}))"
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True
    )
    found: list[str] = json.loads(done.stdout)
    return found


def test_importing_the_library_loads_no_fleet_module_and_reads_no_metadata() -> None:
    """The version is a constant of the source (``_version``), not the installed
    metadata: importlib.metadata is not loaded for it."""
    code = "import autothrottle, autothrottle.store, autothrottle.options"
    assert loaded(code, (*FLEET_ONLY, "importlib.metadata")) == []


def test_a_throttle_and_its_requests_on_the_memory_store_load_no_fleet_module() -> None:
    code = (
        "import anyio, autothrottle.httpx, autothrottle.aiohttp\n"
        "from autothrottle import Throttle\n"
        "throttle = Throttle(start_delay=0.0, min_delay=0.0)\n"
        "async def main():\n"
        "    with await throttle.acquire('a.test') as lease:\n"
        "        lease.observe(0.01, 200)\n"
        "anyio.run(main)\n"
        "with throttle.acquire_blocking('a.test') as lease:\n"
        "    lease.observe(0.01, 503)\n"
        "assert throttle.stats().totals.responses == 2"
    )
    assert loaded(code) == []


def test_a_store_shared_by_a_fleet_loads_the_fleet_when_the_throttle_is_made() -> None:
    code = (
        "import autothrottle.redis as redis_store\n"
        "from autothrottle import Throttle\n"
        "Throttle(store=redis_store.RedisStore('redis://127.0.0.1:1/0', prefix='c-import:'))"
    )
    assert {"autothrottle._fleet", "autothrottle._fleet_wire"} <= set(loaded(code))


def test_a_requests_user_loads_no_asyncio_until_an_async_wait() -> None:
    """A thread's user runs no event loop: importing ``autothrottle.requests``
    and waiting in a thread (a slot at its cap, so the wait is the driver's
    blocking loop) leave asyncio unloaded, which costs that import about a
    twentieth of its instructions (``docs/adapters.md``). The first async wait,
    one that queues behind a held lease, still finds its loop."""
    code = (
        "import threading, autothrottle.requests\n"
        "from autothrottle import Throttle\n"
        "throttle = Throttle(start_delay=0.0, min_delay=0.0, max_concurrency=1)\n"
        "first = throttle.acquire_blocking('a.test')\n"
        "threading.Timer(0.05, first.release).start()\n"
        "with throttle.acquire_blocking('a.test') as lease:\n"
        "    lease.observe(0.01, 200)"
    )
    assert loaded(code, ("asyncio",)) == []
    waited_async = (
        f"{code}\n"
        "import asyncio\n"
        "async def main():\n"
        "    first = await throttle.acquire('a.test')\n"
        "    asyncio.get_running_loop().call_later(0.05, first.release)\n"
        "    with await throttle.acquire('a.test') as lease:\n"
        "        lease.observe(0.01, 200)\n"
        "asyncio.run(main())\n"
        "assert throttle.stats().totals.responses == 2"
    )
    assert loaded(waited_async, ("asyncio",)) == ["asyncio"]


def test_a_sync_httpx_user_loads_no_asyncio_through_its_requests() -> None:
    """A ``ThrottledClient`` in a thread: its responses are held (``_hold``) with
    no event loop to find, and finding none imports nothing."""
    code = (
        "import http.server, threading\n"
        "from autothrottle import Throttle\n"
        "from autothrottle.httpx import ThrottledClient\n"
        "server = http.server.HTTPServer(('127.0.0.1', 0), http.server.SimpleHTTPRequestHandler)\n"
        "threading.Thread(target=server.serve_forever, daemon=True).start()\n"
        "throttle = Throttle(start_delay=0.0, min_delay=0.0)\n"
        "with ThrottledClient(throttle=throttle) as client:\n"
        "    for _ in range(2):\n"
        "        client.get(f'http://127.0.0.1:{server.server_port}/nothing-here')\n"
        "    with client.stream('GET', f'http://127.0.0.1:{server.server_port}/') as response:\n"
        "        response.read()\n"
        "server.shutdown()\n"
        "assert throttle.stats().totals.responses == 3"
    )
    assert loaded(code, ("asyncio",)) == []
