"""throttle.stats(): what the throttle did, per slot and in total, as plain data."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from autothrottle import SlotSnapshot, Throttle, ThrottleStats
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


def test_percentiles_take_the_first_bucket_that_reaches_each_rank() -> None:
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock)
    traffic(throttle, clock, "a", [0.01] * 50 + [0.1] * 40 + [1.0] * 10)
    row = throttle.stats().slots[0]
    # the 50th of 100 is the last at 10 ms, the 90th the last at 100 ms
    assert row.latency_p50 == pytest.approx(0.01, rel=0.19)
    assert row.latency_p90 == pytest.approx(0.1, rel=0.19)
    assert row.latency_p99 == pytest.approx(1.0, rel=0.19)
    assert throttle.stats().totals.latency_p90 == row.latency_p90


def test_a_snapshot_is_the_frozen_record_its_constructor_builds() -> None:
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock)
    traffic(throttle, clock, "a", [0.05, 0.2])
    throttle.backoff("a")
    clock.advance(1.5)
    snap = throttle.snapshot()["a"]
    fields = {each.name: getattr(snap, each.name) for each in dataclasses.fields(SlotSnapshot)}
    built = SlotSnapshot(**fields)
    assert type(snap) is SlotSnapshot
    assert snap == built and repr(snap) == repr(built)
    assert (snap.sent, snap.status_counts, snap.last_backoff_reason) == (2, {200: 2}, "manual")
    assert snap.last_backoff_ago == pytest.approx(1.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.sent = 3  # type: ignore[misc]
    assert dataclasses.replace(snap, sent=3).sent == 3
    traffic(throttle, clock, "a", [0.05])
    assert snap.status_counts == {200: 2}  # a copy, not the live counts
    assert throttle.snapshot()["a"] != snap
