"""Crawl two local hosts through autothrottle's aiohttp adapter.

Self-contained: it starts two aiohttp.web servers on 127.0.0.2 and 127.0.0.3
(distinct hosts, so distinct slots), one fast and one slow, then fetches 20
URLs through :func:`autothrottle.aiohttp.ThrottledSession` with debug logging
on, and prints each slot's state at the end. Run it with::

    python examples/aiohttp_example.py

It needs ``autothrottle[aiohttp]`` and nothing else (the two sites are aiohttp.web).
On macOS, 127.0.0.2 and 127.0.0.3 need aliases first:
``sudo ifconfig lo0 alias 127.0.0.2 && sudo ifconfig lo0 alias 127.0.0.3``.

Watch the debug lines: each slot's delay moves towards
``latency / target_concurrency``, and the fast host is never held back by the
slow one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import sys
import time

import aiohttp
from aiohttp import web

from autothrottle import AutoThrottlePolicy, Throttle
from autothrottle.aiohttp import ThrottledSession

HOSTS = {"127.0.0.2": 0.02, "127.0.0.3": 0.15}  # address -> server think time (s)
PAGES_PER_HOST = 10


async def start_server(address: str, think: float) -> tuple[web.AppRunner, str]:
    """A tiny site at ``address`` taking about ``think`` s per page; returns its origin."""

    async def page(request: web.Request) -> web.Response:
        await asyncio.sleep(think * random.uniform(0.8, 1.2))
        return web.Response(text=f"page {request.match_info['n']} of {address}")

    app = web.Application()
    app.router.add_get("/page/{n}", page)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    sock = socket.socket()
    sock.bind((address, 0))  # any free port
    await web.SockSite(runner, sock).start()
    return runner, f"http://{address}:{sock.getsockname()[1]}"


async def crawl(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url) as response:
        await response.read()
        return response.status


async def main() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(relativeCreated)6.0fms %(message)s"
    )
    logging.getLogger("autothrottle").setLevel(logging.DEBUG)

    servers = [await start_server(address, think) for address, think in HOSTS.items()]
    try:
        # Scrapy's rules, to show each host's delay following its latency
        # (Throttle() alone finds each host's pace without a target).
        throttle = Throttle(
            policy=AutoThrottlePolicy(),
            start_delay=0.5,
            max_delay=5.0,
            target_concurrency=2.0,
            debug=True,
        )
        urls = [f"{origin}/page/{n}" for n in range(PAGES_PER_HOST) for _, origin in servers]
        started = time.monotonic()
        async with ThrottledSession(throttle=throttle) as session:
            statuses = await asyncio.gather(*(crawl(session, url) for url in urls))
        print(
            f"\n{len(statuses)} pages, statuses {sorted(set(statuses))}, "
            f"{time.monotonic() - started:.1f} s\n"
        )
        for key, snap in sorted(throttle.snapshot().items()):
            latency = f"{snap.last_latency * 1000:.0f} ms" if snap.last_latency else "-"
            print(
                f"{key}: delay {snap.delay * 1000:.0f} ms, sent {snap.sent}, "
                f"in flight {snap.in_flight}, last latency {latency}, "
                f"statuses {dict(snap.status_counts)}"
            )
    finally:
        for runner, _ in servers:
            await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
