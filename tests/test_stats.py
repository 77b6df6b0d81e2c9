"""throttle.stats(): what the throttle did, per slot and in total, as plain data."""

from __future__ import annotations

import asyncio
import json

import pytest

from autothrottle import Throttle, ThrottleStats
from helpers import FakeClock


def traffic(throttle: Throttle, clock: FakeClock, key: str, latencies: list[float]) -> None:
    for latency in latencies:
        clock.advance(10.0)
        lease = throttle.try_acquire(key)
        assert lease is not None
        lease.observe(latency=latency, status=200)
        lease.release()


def test_stats_count_statuses_backoffs_and_latency_percentiles() -> None:
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock)
    traffic(throttle, clock, "a", [0.1] * 90 + [1.0] * 10)
    clock.advance(10.0)
    lease = throttle.try_acquire("a")
    assert lease is not None
    lease.observe(latency=0.1, status=429)
    lease.release()
    throttle.backoff("a")
    traffic(throttle, clock, "b", [0.02] * 5)

    stats = throttle.stats()
    assert isinstance(stats, ThrottleStats)
    assert [row.key for row in stats.slots] == ["a", "b"]  # busiest first
    a = stats.slots[0]
    assert (a.sent, a.responses, a.statuses) == (101, 101, {200: 100, 429: 1})
    assert a.backoff_reasons == {"status 429": 1, "manual": 1}
    assert a.latency_p50 == pytest.approx(0.1, rel=0.19)
    assert a.latency_p99 == pytest.approx(1.0, rel=0.19)
    totals = stats.totals
    assert totals is not None
    assert (totals.sent, totals.responses, stats.slot_count) == (106, 106, 2)
    assert totals.statuses == {200: 105, 429: 1}
    json.dumps(stats.to_dict())  # plain data


def test_top_keeps_the_busiest_rows_and_every_slot_in_the_totals() -> None:
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock)
    for index in range(10):
        traffic(throttle, clock, f"host{index}", [0.01] * (index + 1))
    stats = throttle.stats(top=3)
    assert [row.key for row in stats.slots] == ["host9", "host8", "host7"]
    assert stats.totals is not None and stats.totals.sent == sum(range(1, 11))
    with pytest.raises(ValueError, match="top"):
        throttle.stats(top=-1)


async def test_stats_async_and_snapshot_async_let_the_loop_run_over_many_slots() -> None:
    throttle = Throttle(start_delay=0.0)
    for index in range(20_000):
        throttle.slot(f"host{index}")
    ticks = 0
    running = True

    async def ticker() -> None:
        nonlocal ticks
        while running:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    stats = await throttle.stats_async(top=5, chunk=1000)
    during_stats = ticks - before
    snapshot = await throttle.snapshot_async(chunk=1000)
    running = False
    await task
    assert stats.slot_count == 20_000 and len(stats.slots) == 5
    assert len(snapshot) == 20_000
    assert during_stats >= 10  # the loop ran between chunks
