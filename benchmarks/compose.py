"""Compositions at a loopback server: what the host sees when the throttle is stacked.

Run with ``python benchmarks/compose.py`` (a few seconds). Each row sends 6
requests to one loopback host through a throttle with ``FixedDelayPolicy(0.2)``
stacked with something else, and reports what arrived at the host: how many
requests, and the smallest gap between two (the promise is 200 ms).
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import hishel
import hishel.httpx
import httpx
from aiohttp import web

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledClient, AsyncThrottledTransport


async def _plain_httpx(throttle: Throttle, url: str, folder: str) -> None:
    async with AsyncThrottledClient(throttle=throttle) as client:
        for _ in range(6):
            await client.get(url)


async def _cache_given_to_client(throttle: Throttle, url: str, folder: str) -> None:
    storage = hishel.AsyncSqliteStorage(database_path=f"{folder}/a.db")
    cache = hishel.httpx.AsyncCacheTransport(httpx.AsyncHTTPTransport(), storage=storage)
    async with AsyncThrottledClient(throttle=throttle, transport=cache) as client:
        for _ in range(6):
            await (await client.get(url)).aread()


async def _cache_around_throttle(throttle: Throttle, url: str, folder: str) -> None:
    storage = hishel.AsyncSqliteStorage(database_path=f"{folder}/b.db")
    cache = hishel.httpx.AsyncCacheTransport(
        AsyncThrottledTransport(throttle=throttle), storage=storage
    )
    async with httpx.AsyncClient(transport=cache) as client:
        for _ in range(6):
            await (await client.get(url)).aread()


async def _retry_middleware(throttle: Throttle, url: str, folder: str) -> None:
    async def retry(request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
        for _ in range(3):
            response = await handler(request)
            if response.status != 503:
                return response
            response.release()
        return response

    async with ThrottledSession(throttle=throttle, middlewares=(retry,)) as session:
        for index in range(3):
            async with session.get(f"{url}flaky{index}") as response:
                await response.read()


async def _threads_and_tasks(throttle: Throttle, url: str, folder: str) -> None:
    from autothrottle.httpx import ThrottledClient

    with ThrottledClient(throttle=throttle) as sync_client:
        async with AsyncThrottledClient(throttle=throttle) as client:
            await asyncio.gather(
                asyncio.to_thread(lambda: [sync_client.get(url) for _ in range(3)]),
                *(client.get(url) for _ in range(3)),
            )


ROWS = [
    ("AsyncThrottledClient alone", _plain_httpx),
    ("hishel cache given to AsyncThrottledClient (moved outside)", _cache_given_to_client),
    ("hishel cache around AsyncThrottledTransport", _cache_around_throttle),
    ("aiohttp retry middleware before the throttle (503 once)", _retry_middleware),
    ("3 threads' sync client + 3 tasks, one throttle", _threads_and_tasks),
]


async def main() -> None:
    print(f"{'composition':58} {'arrived':>7} {'smallest gap':>13}")
    for name, run in ROWS:
        arrivals = await _measure(run)
        gaps = [b - a for a, b in itertools.pairwise(sorted(arrivals))]
        smallest = f"{1000 * min(gaps):.0f} ms" if gaps else "-"
        print(f"{name:58} {len(arrivals):>7} {smallest:>13}", flush=True)


async def _measure(run: Callable[[Throttle, str, str], Awaitable[None]]) -> list[float]:
    """Run one composition against a fresh loopback host; its arrival times."""
    arrivals: list[float] = []
    flaky: set[str] = set()

    async def handle(request: web.Request) -> web.Response:
        arrivals.append(time.monotonic())
        if request.path.startswith("/flaky") and request.path not in flaky:
            flaky.add(request.path)  # each flaky page fails once
            return web.Response(status=503)
        return web.Response(text="ok", headers={"Cache-Control": "max-age=60"})

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.2", 0)
    await site.start()
    url = f"http://127.0.0.2:{runner.addresses[0][1]}/"
    with tempfile.TemporaryDirectory() as folder:
        await run(Throttle(policy=FixedDelayPolicy(0.2)), url, folder)
    await runner.cleanup()
    return arrivals


if __name__ == "__main__":
    asyncio.run(main())
