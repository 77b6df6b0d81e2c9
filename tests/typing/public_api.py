"""A user's script of the public API, type-checked by `nox -s types` (mypy --strict and
basedpyright strict); never run. Each line is what docs/ shows a user writing: if the
library's types stop accepting it, the type check fails.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from autothrottle import (
    Acquiring,
    FixedRatePolicy,
    HostSettings,
    Lease,
    SlotStats,
    Throttle,
    ThrottleEvent,
    ThrottleStats,
)
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledClient, ThrottledClient
from autothrottle.redis import RedisStore
from autothrottle.store import MemoryStore, SlotStore


def fleet() -> Throttle:
    """docs/fleet.md's first example."""
    return Throttle(store=RedisStore("redis://10.0.0.5:6379/0", prefix="crawl-42"))


def stores() -> list[SlotStore]:
    saved = MemoryStore.from_file("learned.json", now=time.monotonic())
    return [saved, RedisStore("redis://127.0.0.1:6379/0", prefix="p"), MemoryStore()]


def totals(throttle: Throttle) -> int:
    stats: ThrottleStats = throttle.stats(top=10)
    row: SlotStats = stats.totals  # never None
    return row.sent + row.responses


async def by_hand(throttle: Throttle) -> float:
    lease: Lease = await throttle.acquire("example.com", max_wait=5.0)
    with lease:
        lease.observe(latency=0.2, status=200, headers={"Retry-After": "3"})
    return throttle.slot("example.com").delay


async def turns(throttle: Throttle) -> None:
    """docs/guide.md's `acquire`: what it returns is named, entered, awaited, run by a task."""
    turn: Acquiring = throttle.acquire("example.com", max_wait=5.0)
    async with turn as held:
        held.observe(latency=0.2, status=200)
    async with throttle.acquire("example.com") as lease:
        lease.observe(latency=0.1, status=503, headers={"Retry-After": "3"})
    awaited: Lease = await throttle.acquire("example.com", cost={"tokens": 100.0})
    awaited.release()
    task: asyncio.Task[Lease] = asyncio.create_task(throttle.acquire("example.com"))
    (await task).release()


class Counted(Throttle):
    """Acquiring's docstring: a subclass wrapping `acquire` keeps what callers may write."""

    waits = 0

    def acquire(self, key: str, **kwargs: Any) -> Acquiring:
        return Acquiring(self._counted(super().acquire(key, **kwargs)))

    async def _counted(self, turn: Acquiring) -> Lease:
        self.waits += 1
        return await turn


async def counted() -> int:
    throttle = Counted(max_wait=30.0)
    async with throttle.acquire("example.com") as lease:
        lease.observe(latency=0.2, status=200)
    await turns(throttle)
    return throttle.waits


def on_event(event: ThrottleEvent) -> None:
    print(event.kind, event.slot)


async def clients() -> None:
    throttle = Throttle(
        policy=FixedRatePolicy(2),
        hosts={"*.example.com": HostSettings(max_concurrency=2)},
        max_wait=30.0,
    )
    stop = throttle.listen(on_event)
    async with AsyncThrottledClient(throttle=throttle) as client:
        response: httpx.Response = await client.get("https://example.com/")
        print(response.status_code)
    async with ThrottledSession(throttle=throttle) as session, session.get("https://x.org/") as r:
        print(r.status)
    with ThrottledClient(throttle=throttle) as sync:
        print(sync.get("https://example.com/").status_code)
    stop()
