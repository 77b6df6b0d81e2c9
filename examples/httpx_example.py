"""Crawl two local hosts with httpx, paced per host by autothrottle.

Run it with ``python examples/httpx_example.py`` (needs ``autothrottle[httpx,aiohttp]``;
aiohttp only serves the two demo hosts). It starts a small aiohttp.web server
on 127.0.0.2 (fast: ~20 ms per answer) and one on 127.0.0.3 (slow: ~120 ms),
fetches 20 pages through :class:`autothrottle.httpx.AsyncThrottledTransport`, and
prints every slot's state. Each host gets its own slot: the slow host's delay
settles higher than the fast one's, and neither holds the other back.

On macOS, 127.0.0.2 and 127.0.0.3 need aliases first:
``sudo ifconfig lo0 alias 127.0.0.2 && sudo ifconfig lo0 alias 127.0.0.3``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from aiohttp import web

from autothrottle import AutoThrottlePolicy, Throttle
from autothrottle.httpx import AsyncThrottledTransport

HOSTS = {"127.0.0.2": 0.02, "127.0.0.3": 0.12}  # address -> seconds per answer


@asynccontextmanager
async def demo_servers() -> AsyncIterator[list[str]]:
    """Start one server per address; yield their origins."""
    runners: list[web.AppRunner] = []
    origins: list[str] = []
    try:
        for address, latency in HOSTS.items():

            async def page(request: web.Request, latency: float = latency) -> web.Response:
                await asyncio.sleep(latency)
                return web.Response(text=f"page {request.match_info['n']}")

            app = web.Application()
            app.router.add_get("/page/{n}", page)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, address, 0)
            await site.start()
            port = runner.addresses[0][1]
            origins.append(f"http://{address}:{port}")
        yield origins
    finally:
        for runner in runners:
            await runner.cleanup()


async def main() -> None:
    # debug=True logs one line per adjusted response on the "autothrottle" logger.
    logging.basicConfig(stream=sys.stdout, format="%(relativeCreated)6.0fms %(name)s: %(message)s")
    logging.getLogger("autothrottle").setLevel(logging.DEBUG)
    # Scrapy's rules, to show each host's delay following its latency
    # (Throttle() alone finds each host's pace without a target).
    throttle = Throttle(
        policy=AutoThrottlePolicy(),
        start_delay=0.3,
        max_delay=3.0,
        target_concurrency=2.0,
        debug=True,
    )

    async with demo_servers() as origins:
        urls = [f"{origin}/page/{n}" for origin in origins for n in range(10)]
        transport = AsyncThrottledTransport(throttle=throttle)
        started = time.monotonic()
        async with httpx.AsyncClient(transport=transport) as client:
            # All 20 at once: the throttle spaces them per host.
            responses = await asyncio.gather(*(client.get(url) for url in urls))
            # Per-request control: a health check that is neither delayed nor counted.
            await client.get(urls[0], headers={"X-AutoThrottle": "bypass"})
        elapsed = time.monotonic() - started

    print(f"\nfetched {len(responses)} pages in {elapsed:.1f}s")
    print(f"statuses: {sorted({r.status_code for r in responses})}")
    for key, slot in throttle.snapshot().items():
        latency = f"{slot.last_latency * 1000:.0f}ms" if slot.last_latency is not None else "-"
        print(
            f"slot {key}: delay={slot.delay * 1000:.0f}ms in_flight={slot.in_flight} "
            f"sent={slot.sent} responses={slot.responses} failures={slot.failures} "
            f"last_latency={latency} statuses={dict(slot.status_counts)}"
        )


if __name__ == "__main__":
    asyncio.run(main())
