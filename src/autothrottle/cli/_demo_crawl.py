"""The demo's crawl: the one throttle, a few workers per host, and what each saw.

Every host is crawled through ONE :class:`~autothrottle.Throttle` (built by
:func:`build_throttle`), some with httpx and some with aiohttp (:func:`fetchers`),
by :data:`WORKERS` workers each that fetch page after page until told to stop.
:class:`Tally` is what the crawler itself saw from a host; the site's own count,
its ground truth, is what the demo judges by (``_demo_judge``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import httpx

from autothrottle import AdaptiveConcurrencyPolicy, Throttle
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledClient
from autothrottle.sim import is_blocked_page
from autothrottle.timeline import Timeline

from ._demo_sites import Client, Site

__all__ = ["WORKERS", "Crawl", "Fetch", "Host", "Tally", "build_throttle", "fetchers"]

#: Requests each host's workers may have under way at once; the throttle's
#: ``max_concurrency`` is the same, so the throttle, not the worker count, sets the pace.
WORKERS = 8


def build_throttle(demo_sites: list[Site], *, seed: int | None = None) -> Throttle:
    """The one throttle every host goes through: one policy for every site, no
    per-host tuning (a newcomer's settings), and a short start delay."""
    return Throttle(
        policy=AdaptiveConcurrencyPolicy(),
        start_delay=0.5,
        max_delay=10.0,
        max_concurrency=WORKERS,
        hosts={s.address: s.settings for s in demo_sites if s.settings is not None},
        rng=random.Random(seed),
    )


@dataclass
class Tally:
    """What the crawler itself saw from one host."""

    responses: int = 0
    ok: int = 0
    limited: int = 0
    blocked: int = 0
    cache_hits: int = 0
    other: int = 0
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


@dataclass
class Host:
    """One site as the crawl sees it: where it is served, its tally, its next page."""

    site: Site
    base_url: str
    tally: Tally = field(default_factory=Tally)
    pages: itertools.count[int] = field(default_factory=itertools.count)

    def next_url(self) -> str:
        return f"{self.base_url}/page/{next(self.pages)}"


Fetch = Callable[[str], Awaitable[tuple[int, bytes, str]]]


class Crawl:
    """The crawl's shared state: hosts, throttle, timeline, stop signal."""

    def __init__(self, hosts: list[Host], throttle: Throttle, timeline: Timeline) -> None:
        self.hosts = hosts
        self.throttle = throttle
        self.timeline = timeline
        self.stop = asyncio.Event()

    def record(self, host: Host, url: str, status: int, body: bytes, cache: str) -> None:
        tally = host.tally
        tally.responses += 1
        tally.statuses[status] = tally.statuses.get(status, 0) + 1
        if cache.upper().startswith("HIT"):
            tally.cache_hits += 1
        if status == 200 and is_blocked_page(body):
            # Status 200, fast: only the body says we were blocked. Tell the
            # throttle, as any crawler that can recognise a block page should.
            tally.blocked += 1
            self.throttle.backoff(url)
            self.timeline.mark(host.site.address, "blocked")
        elif status == 200:
            tally.ok += 1
        elif status == 429:
            tally.limited += 1
        else:
            tally.other += 1

    async def worker(self, host: Host, fetch: Fetch) -> None:
        while not self.stop.is_set():
            url = host.next_url()
            try:
                status, body, cache = await fetch(url)
            except (TimeoutError, httpx.HTTPError, aiohttp.ClientError, OSError):
                host.tally.errors += 1
                await asyncio.sleep(0.05)  # never spin on a dead host
                continue
            self.record(host, url, status, body, cache)

    def start(self, fetch: dict[Client, Fetch]) -> list[asyncio.Task[None]]:
        """:data:`WORKERS` workers for each host, each fetching with its host's client."""
        return [
            asyncio.create_task(self.worker(h, fetch[h.site.client]))
            for h in self.hosts
            for _ in range(WORKERS)
        ]

    async def finish(self, workers: list[asyncio.Task[None]]) -> None:
        """Give the requests under way a moment to finish, then cancel the rest
        (most are only waiting for their turn)."""
        self.stop.set()
        _, pending = await asyncio.wait(workers, timeout=0.5)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


@contextlib.asynccontextmanager
async def fetchers(throttle: Throttle) -> AsyncIterator[dict[Client, Fetch]]:
    """One GET through each client, both clients going through ``throttle``."""
    async with (
        AsyncThrottledClient(
            throttle=throttle,
            trust_env=False,  # loopback only, whatever proxies the environment names
            timeout=httpx.Timeout(15.0),
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=100),
        ) as client,
        ThrottledSession(
            throttle=throttle,
            timeout=aiohttp.ClientTimeout(total=15.0),
            connector=aiohttp.TCPConnector(limit=100),
        ) as session,
    ):
        yield {"httpx": _httpx_fetch(client), "aiohttp": _aiohttp_fetch(session)}


def _httpx_fetch(client: httpx.AsyncClient) -> Fetch:
    async def fetch(url: str) -> tuple[int, bytes, str]:
        response = await client.get(url)
        return response.status_code, response.content, response.headers.get("X-Cache", "")

    return fetch


def _aiohttp_fetch(session: aiohttp.ClientSession) -> Fetch:
    async def fetch(url: str) -> tuple[int, bytes, str]:
        async with session.get(url) as response:
            body = await response.read()
            return response.status, body, response.headers.get("X-Cache", "")

    return fetch
