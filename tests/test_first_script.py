"""A new user's first script: the README's quickstarts, as a newcomer extends them,
with the defaults (``Throttle()``), complete, on every client.

The scripts: ``asyncio.gather`` over 200 URLs of one host (httpx and aiohttp),
and the thread snippet (``pool.map`` with 8 threads) over URLs sorted by host
(httpx's sync client and requests). They run on a VirtualClock, which skips the
throttle's waits but takes every decision as ``Throttle()`` would: the settings
are the defaults, and the clock says how long each script would have taken,
which is asserted with a generous bound. Loopback servers only.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx

from autothrottle import Throttle
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledTransport, ThrottledClient
from autothrottle.requests import ThrottledSession as RequestsSession
from autothrottle.testing import VirtualClock
from loopback import loopback_hosts, running_hosts

PAGES = 200


def _would_take(clock: VirtualClock, started: float) -> float:
    return clock() - started


async def test_gather_over_200_urls_of_one_host_with_httpx() -> None:
    clock = VirtualClock()
    throttle = Throttle(clock=clock)  # the defaults; only the clock is a test's
    async with loopback_hosts(1) as (host,):
        urls = [host.url(f"/page/{i}") for i in range(PAGES)]
        started = clock()
        transport = AsyncThrottledTransport(throttle=throttle)
        async with httpx.AsyncClient(transport=transport) as client:
            responses = await asyncio.gather(*(client.get(url) for url in urls))
        took = _would_take(clock, started)
    assert [r.status_code for r in responses] == [200] * PAGES
    assert throttle.stats().totals.sent == PAGES
    assert took < 60.0  # a fast host: the ramp-up reaches it within seconds


async def test_gather_over_200_urls_of_one_host_with_aiohttp() -> None:
    clock = VirtualClock()
    throttle = Throttle(clock=clock)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:

        async def fetch(url: str) -> str:
            async with session.get(url) as response:
                return await response.text()

        started = clock()
        bodies = await asyncio.gather(*(fetch(host.url(f"/page/{i}")) for i in range(PAGES)))
        took = _would_take(clock, started)
    assert bodies == ["ok"] * PAGES
    assert throttle.stats().totals.sent == PAGES
    assert took < 60.0


def _sorted_urls(hosts: list[str]) -> list[str]:
    return sorted(f"{origin}/page/{i}" for origin in hosts for i in range(40))


def test_the_thread_snippet_over_urls_sorted_by_host_with_httpx() -> None:
    clock = VirtualClock()
    throttle = Throttle(clock=clock)
    with running_hosts(3) as hosts:
        urls = _sorted_urls([h.origin for h in hosts])
        started = clock()
        with ThrottledClient(throttle=throttle) as client, ThreadPoolExecutor(8) as pool:
            pages = list(pool.map(client.get, urls))
        took = _would_take(clock, started)
    assert [p.status_code for p in pages] == [200] * len(urls)
    stats = throttle.stats()
    assert (stats.slot_count, stats.totals.sent) == (3, len(urls))
    assert took < 90.0  # one host at a time, as the sorted list hands them out


def test_the_thread_snippet_over_urls_sorted_by_host_with_requests() -> None:
    clock = VirtualClock()
    throttle = Throttle(clock=clock)
    with running_hosts(3) as hosts:
        urls = _sorted_urls([h.origin for h in hosts])
        started = clock()
        with RequestsSession(throttle=throttle) as session, ThreadPoolExecutor(8) as pool:
            pages = list(pool.map(session.get, urls))
        took = _would_take(clock, started)
    assert [p.status_code for p in pages] == [200] * len(urls)
    assert throttle.stats().totals.sent == len(urls)
    assert took < 90.0
