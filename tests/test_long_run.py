"""A crawl that runs for days: what the process holds after many hosts came and went.

Each test drives thousands of slot keys (or hundreds of real loopback hosts
through an adapter) past the store's ``idle_timeout`` on a moved clock, and
counts what is left in every structure that grows with hosts: the slots and
their records, the adapters' pools, the timeline's last snapshots, Scrapy's
per-slot figures, the fetch's robots.txt rules, the per-host settings, and
the keys a fleet leaves in Redis. Counts, not bytes or seconds: they do not
depend on the machine's load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from aiohttp import web
from scrapy.settings import Settings

from autothrottle import HostSettings, Throttle
from autothrottle._hosts import HostTable
from autothrottle.aiohttp import ThrottledSession
from autothrottle.cli._fetch import timeline_for
from autothrottle.cli._robots import Robots
from autothrottle.httpx import AsyncThrottledClient
from autothrottle.redis import RedisStore
from autothrottle.scrapy import AutoThrottleMiddleware
from autothrottle.store import MemoryStore
from autothrottle.timeline import Timeline
from helpers import FakeClock, needs_redis
from loopback import served_here
from redis_keys import fresh_prefix

IDLE = 60.0
"""The stores' idle_timeout here: a wave of hosts is forgotten a minute after its last use."""

WAVE = 500
"""Hosts in use at once in the engine's tests; every wave is new hosts."""

WAVES = 8
"""4,000 distinct keys in all."""


def answer(lease: Any, i: int) -> None:
    """Finish a request with one of a few answers: a success, a refusal that
    pauses the slot (Retry-After), a rate-limit header, a failure."""
    kind = i % 4
    if kind == 0:
        lease.finish(0.05, 200)
    elif kind == 1:
        lease.finish(0.05, 429, {"Retry-After": "2"})
    elif kind == 2:
        lease.finish(0.05, 200, {"RateLimit": "limit=10, remaining=0, reset=5"})
    else:
        lease.fail(ConnectionError("reset"))
        lease.release()


def wave_of_requests(throttle: Throttle, keys: list[str]) -> None:
    for i, key in enumerate(keys):
        lease = throttle.try_acquire(key)
        assert lease is not None  # a new slot's first request goes at once
        answer(lease, i)


def test_the_engine_holds_its_live_slots_not_every_host_it_met() -> None:
    clock = FakeClock()
    store = MemoryStore(idle_timeout=IDLE)
    throttle = Throttle(store=store, clock=clock, wall_clock=clock.wall)
    table = throttle._table
    for wave in range(WAVES):
        wave_of_requests(throttle, [f"w{wave}-h{i}.test" for i in range(WAVE)])
        # A new wave's slots sweep the last one's (each new slot looks at a
        # bounded batch of the oldest): at most two waves are held.
        assert len(table) <= 2 * WAVE, (wave, len(table))
        assert len(store) <= 2 * WAVE, (wave, len(store))
        clock.advance(IDLE + 10.0)  # past the pauses (5 s at most) and the idle timeout
    throttle.evict_idle()
    assert len(table) == len(store) == 0
    assert len(store._records) == 0  # the dict's table was rebuilt, not kept at its most


def test_a_timeline_keeps_the_last_snapshot_of_live_slots_only() -> None:
    clock = FakeClock()
    throttle = Throttle(store=MemoryStore(idle_timeout=IDLE), clock=clock, wall_clock=clock.wall)
    timeline = Timeline(throttle, interval=1.0, clock=clock, max_samples=4)
    for wave in range(WAVES):
        wave_of_requests(throttle, [f"w{wave}-h{i}.test" for i in range(WAVE)])
        timeline.sample()
        assert len(timeline._last) <= 2 * WAVE, (wave, len(timeline._last))
        clock.advance(IDLE + 10.0)
    throttle.evict_idle()
    timeline.sample()
    assert timeline._last == {}


def test_the_fetchs_timeline_keeps_max_slots_of_ten_thousand_hosts(tmp_path: Path) -> None:
    clock = FakeClock()
    throttle = Throttle(store=MemoryStore(idle_timeout=IDLE), clock=clock, wall_clock=clock.wall)
    path = tmp_path / "t.jsonl"
    timeline = timeline_for(throttle, str(path))
    waves = 20  # of WAVE hosts: 10,000 in all
    for wave in range(waves):
        wave_of_requests(throttle, [f"w{wave}-h{i}.test" for i in range(WAVE)])
        for _ in range(4):  # the wave's answers, then its slots idle (repeats)
            timeline.sample()
            clock.advance(0.25)
        kept = timeline._series
        assert len(kept) <= timeline.max_slots, (wave, len(kept))
        # Each slot kept: its sample at work, a quiet one and its repeats (one entry).
        assert all(sum(1 for _ in series.stored()) <= 2 for series in kept.values())
        assert len(timeline._idle) <= timeline.max_slots
        assert len(timeline._unwritten) <= 2 * WAVE
        assert len(timeline._statuses) <= 1024
        clock.advance(IDLE + 10.0)
    timeline.close()
    assert timeline._unwritten == {}
    # The file has every host: a line at work, a quiet one, a run of repeats.
    lines = path.read_text().count("\n")
    assert lines <= 1 + 3 * waves * WAVE, lines


def test_a_slot_made_again_under_its_key_counts_from_zero_in_the_timeline() -> None:
    clock = FakeClock()
    throttle = Throttle(store=MemoryStore(idle_timeout=IDLE), clock=clock, wall_clock=clock.wall)
    timeline = Timeline(throttle, interval=1.0, clock=clock)
    wave_of_requests(throttle, ["a.test"])
    timeline.sample()
    clock.advance(IDLE + 10.0)
    throttle.evict_idle()
    timeline.sample()  # the slot is gone: nothing sampled
    for _ in range(3):  # made again: three responses, more than the old one had
        clock.advance(5.0)  # past the delay
        wave_of_requests(throttle, ["a.test"])
    timeline.sample()
    assert [s.responses for s in timeline.samples("a.test")] == [1, 3]


# -- Scrapy's middleware ---------------------------------------------------------------------


class _Crawler:
    """What the middleware reads of a crawler when it is built (weakly referenced)."""

    def __init__(self) -> None:
        self.settings = Settings({"AUTOTHROTTLE_ENABLED": False})
        self.spidercls = None
        self.signals = SimpleNamespace(connect=lambda *args, **kwargs: None)
        self.stats = _Stats()


class _Stats:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def set_value(self, key: str, value: Any) -> None:
        self.values[key] = value


def _middleware() -> tuple[_Crawler, AutoThrottleMiddleware, FakeClock, Throttle]:
    """Scrapy's middleware over a throttle on a fake clock, the store's idle timeout IDLE."""
    crawler = _Crawler()
    middleware = AutoThrottleMiddleware(crawler)  # type: ignore[arg-type]
    clock = FakeClock()
    throttle = Throttle(store=MemoryStore(idle_timeout=IDLE), clock=clock, wall_clock=clock.wall)
    middleware.throttle = throttle
    return crawler, middleware, clock, throttle


def scrapy_wave(middleware: AutoThrottleMiddleware, throttle: Throttle, wave: int) -> None:
    """WAVE new hosts, each first seen by the middleware (what process_request does
    before the turn), then a request each through the throttle."""
    keys = [f"w{wave}-h{i}.test" for i in range(WAVE)]
    for key in keys:
        middleware._first_sight(key)
    wave_of_requests(throttle, keys)


def test_scrapys_middleware_keeps_a_row_per_live_slot_and_counts_every_slot() -> None:
    crawler, middleware, clock, throttle = _middleware()
    for wave in range(WAVES):
        scrapy_wave(middleware, throttle, wave)
        assert len(middleware._seen) <= 1024 + WAVE, (wave, len(middleware._seen))
        clock.advance(IDLE + 10.0)
    middleware._final_stats()
    stats = crawler.stats.values
    assert stats["autothrottle/slots"] == WAVES * WAVE
    # The figures are read from the live slots: none forgotten is made again to be read.
    assert len(throttle._table) <= 2 * WAVE
    # Each wave paused a quarter of its slots (the 429s); the last waves' count, at least.
    assert WAVE // 4 <= stats["autothrottle/pauses"] <= WAVES * WAVE // 4


def test_scrapys_closing_stats_make_no_forgotten_slot_again() -> None:
    crawler, middleware, clock, throttle = _middleware()
    for wave in range(2):  # fewer slots than the middleware looks at: it never looked
        scrapy_wave(middleware, throttle, wave)
        clock.advance(IDLE + 10.0)
    assert len(throttle._table) == WAVE  # the second wave's slots swept the first's
    middleware._final_stats()
    assert len(throttle._table) == WAVE
    assert crawler.stats.values["autothrottle/slots"] == 2 * WAVE


# -- autothrottle fetch's robots.txt and per-host floors -----------------------------------------


class _NoRobots:
    """A sender whose every robots.txt answers 404 (everything allowed), its
    request taken through the throttle as the fetch's client takes it."""

    def __init__(self, throttle: Throttle) -> None:
        self.throttle = throttle
        self.asked = 0

    async def get(self, url: str, **kwargs: Any) -> Any:
        self.asked += 1
        lease = self.throttle.try_acquire(self.throttle.key_for(url))
        assert lease is not None  # a new slot's first request goes at once
        lease.finish(0.05, 404)
        return SimpleNamespace(status=404, head=b"")


async def test_the_fetch_holds_the_robots_rules_of_live_hosts_only() -> None:
    clock = FakeClock()
    throttle = Throttle(store=MemoryStore(idle_timeout=IDLE), clock=clock, wall_clock=clock.wall)
    sender = _NoRobots(throttle)
    robots = Robots(sender, throttle, "test", attempts=1, note=lambda text: None)
    for wave in range(WAVES):
        for i in range(WAVE):
            await robots.rules(f"http://w{wave}-h{i}.test/page")
            await robots.rules(f"http://w{wave}-h{i}.test/other")  # known: not read again
        assert len(robots._known) <= 1024 + WAVE, (wave, len(robots._known))
        clock.advance(IDLE + 10.0)
    assert sender.asked == WAVES * WAVE  # each host's once
    await robots.rules("http://w0-h0.test/again")  # forgotten, and back
    assert sender.asked == WAVES * WAVE + 1


def test_a_floor_set_for_each_host_met_does_not_rebuild_the_index() -> None:
    throttle = Throttle()
    rebuilt = [0]
    index = HostTable._index

    def counted(table: HostTable) -> None:
        rebuilt[0] += 1
        index(table)

    HostTable._index = counted  # type: ignore[method-assign, assignment]
    try:
        for i in range(2000):
            throttle.set_host(f"h{i}.test", HostSettings(min_delay=1.0, max_delay=60.0))
        throttle.set_host("*.glob.test", HostSettings(min_delay=2.0))
    finally:
        HostTable._index = index  # type: ignore[method-assign]
    assert rebuilt == [1]  # the glob's, not one per host
    assert throttle.config_for("h1999.test").min_delay == 1.0
    assert throttle.config_for("a.glob.test").min_delay == 2.0
    assert throttle.config_for("H7.TEST").min_delay == 1.0


# -- the adapters, against real loopback hosts -----------------------------------------------

ADDRESSES = [f"127.0.0.{i}" for i in range(2, 122)]
"""120 distinct hosts."""


@asynccontextmanager
async def hosts(addresses: list[str]) -> AsyncIterator[list[str]]:
    """A server on each address; the URLs."""

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    async with served_here(addresses, app) as urls:
        yield urls


def moved_throttle(shift: list[float]) -> Throttle:
    return Throttle(
        start_delay=0.0, clock=lambda: time.monotonic() + shift[0], store=MemoryStore(IDLE)
    )


async def test_httpx_closes_the_pools_of_hosts_gone_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    shift = [0.0]
    monkeypatch.setattr("autothrottle._httpx._async.monotonic", lambda: time.monotonic() + shift[0])
    throttle = moved_throttle(shift)
    async with hosts(ADDRESSES) as urls, AsyncThrottledClient(throttle=throttle) as client:
        pools = client._transport.inner.pools  # type: ignore[attr-defined]
        half = len(urls) // 2
        for wave in (urls[:half], urls[half:], urls[:half], urls[half:]):
            for url in wave:
                assert (await client.get(url)).status_code == 200
            # Each request looks at the oldest pools: those of the wave before,
            # idle past their slot's idle_timeout, are closed by this one's.
            assert len(pools) <= half, len(pools)
            assert len(throttle._table) <= 2 * half, len(throttle._table)
            shift[0] += IDLE + 10.0


async def test_aiohttp_keeps_nothing_per_host_past_its_slot() -> None:
    shift = [0.0]
    throttle = moved_throttle(shift)
    async with hosts(ADDRESSES) as urls, ThrottledSession(throttle=throttle) as session:
        half = len(urls) // 2
        for wave in (urls[:half], urls[half:], urls[:half]):
            for url in wave:
                async with session.get(url) as response:
                    assert response.status == 200
                    await response.read()
            assert len(throttle._table) <= 2 * half, len(throttle._table)
            shift[0] += IDLE + 10.0
        throttle.evict_idle()
        assert len(throttle._table) == 0


# -- a fleet: the keys it leaves in Redis ------------------------------------------------------

REDIS = "redis://127.0.0.1:6379/0"


async def test_a_fleet_leaves_no_key_in_redis_past_its_ttl() -> None:
    needs_redis()
    prefix = fresh_prefix("long-run")
    admin = redis.Redis.from_url(REDIS)
    shift = [0.0]
    store = RedisStore(REDIS, prefix=prefix, ttl=1.0, idle_timeout=IDLE)
    throttle = Throttle(
        start_delay=0.0,
        hold_timeout=1.0,
        clock=lambda: time.monotonic() + shift[0],
        store=store,
    )
    try:
        async with store:
            for wave in range(3):
                for i in range(40):
                    lease = await throttle.acquire(f"w{wave}-h{i}.test")
                    answer(lease, i)
                shift[0] += IDLE + 10.0
                # This process forgets the fleet's slots with its own.
                assert len(store._runs._runs) <= 2 * 40
                assert len(store._outage._alone) <= 2 * 40
            assert list(admin.scan_iter(match=f"{{{prefix}:*", count=1000))  # written
        await asyncio.sleep(1.5)  # past the ttl (and each lease's hold)
        assert list(admin.scan_iter(match=f"{{{prefix}:*", count=1000)) == []
    finally:
        for key in admin.scan_iter(match=f"{{{prefix}:*", count=1000):
            admin.delete(key)
        admin.close()
