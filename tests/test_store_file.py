"""Kept across restarts without Redis: MemoryStore.save_file / from_file."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, Throttle
from autothrottle.aiohttp import ThrottledSession
from autothrottle.sim import RateLimited, SimServer
from autothrottle.store import MemoryStore
from helpers import FakeClock

HOSTS = [f"127.0.0.{i}" for i in range(2, 6)]


def test_records_round_trip_through_a_file(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore()
    throttle = Throttle(start_delay=0.0, store=store, clock=clock)
    lease = throttle.try_acquire("api")
    assert lease is not None
    lease.observe(latency=0.2, status=429, headers={"Retry-After": "30"})
    lease.release()
    path = tmp_path / "learned.json"
    store.save_file(path, now=clock.now)
    later = 5_000.0
    loaded = MemoryStore.from_file(path, now=later)
    state = loaded.load("api")
    assert state is not None
    assert state.delay == throttle.slot("api").delay
    assert state.pause_until - later == pytest.approx(30.0)
    assert len(MemoryStore.from_file(tmp_path / "missing.json", now=later)) == 0
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"bad\.json"):
        MemoryStore.from_file(tmp_path / "bad.json", now=later)


async def crawl(sim: SimServer, store: MemoryStore) -> int:
    """Ten pages from each host; returns the refusals the hosts counted."""
    throttle = Throttle(policy=AdaptiveConcurrencyPolicy(), start_delay=0.2, store=store)

    async def host(address: str) -> None:
        for page in range(10):
            async with session.get(sim.url(address, f"/{page}")) as response:
                await response.read()

    async with ThrottledSession(throttle=throttle) as session:
        await asyncio.gather(*(host(address) for address in HOSTS))
    return sum(stats.statuses.get(429, 0) for stats in sim.stats().values())


async def test_a_second_run_from_the_saved_file_is_refused_less(tmp_path: Path) -> None:
    behaviour = RateLimited(rate=4, burst=1, headers=False)
    path = tmp_path / "learned.json"
    async with SimServer(dict.fromkeys(HOSTS, behaviour)) as sim:
        store = MemoryStore()
        first = await crawl(sim, store)
        store.save_file(path, now=time.monotonic())
        sim.reset()
        second = await crawl(sim, MemoryStore.from_file(path, now=time.monotonic()))
    assert first >= 1  # the hosts had to teach the first run their limit
    assert second < first


def test_saves_from_four_threads_to_one_path_all_succeed(tmp_path: Path) -> None:
    store = MemoryStore()
    throttle = Throttle(start_delay=0.0, store=store)
    for host in ("a", "b", "c"):
        lease = throttle.try_acquire(host)
        assert lease is not None
        lease.release()
    path = tmp_path / "learned.json"
    failures: list[BaseException] = []

    def save_many() -> None:
        for _ in range(20):
            try:
                store.save_file(path, now=time.monotonic())
            except Exception as error:  # counted: every save must succeed
                failures.append(error)

    threads = [threading.Thread(target=save_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert sorted(MemoryStore.from_file(path, now=time.monotonic())) == ["a", "b", "c"]
    assert [p.name for p in tmp_path.iterdir()] == ["learned.json"]  # no temporary left
