"""The status-aware rules against real loopback servers, judged at the server.

These tests use real time with generous bounds: what they assert is an order
of events at the server (nothing arrives before a pause ends; one backoff per
burst), never a speed.
"""

from __future__ import annotations

import asyncio
import email.utils
import time

import aiohttp
import httpx
import pytest

from autothrottle import AutoThrottlePolicy, Throttle
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledClient
from autothrottle.sim import CDN, Capacity, RateLimited, SimServer
from helpers import record_of
from loopback import loopback_hosts, promptly


def fast_throttle(**kwargs: object) -> Throttle:
    settings: dict[str, object] = {"start_delay": 0.0, "max_delay": 5.0, "max_concurrency": 8}
    settings.update(kwargs)
    return Throttle(**settings)  # type: ignore[arg-type]


async def test_retry_after_seconds_pauses_only_that_slot() -> None:
    # max_delay: the backoff after the pause spaces the three later requests
    # by at most half a second, not five.
    throttle = fast_throttle(max_delay=0.5)
    async with (
        loopback_hosts(2) as (paused, other),
        AsyncThrottledClient(throttle=throttle) as client,
    ):
        refused = await client.get(paused.url("/status/429?h.Retry-After=3"))
        assert refused.status_code == 429
        refused_at = paused.arrivals[0].time
        results = await asyncio.gather(
            *(client.get(paused.url(f"/after/{i}")) for i in range(3)),
            *(client.get(other.url(f"/free/{i}")) for i in range(3)),
        )
        assert all(r.status_code == 200 for r in results)
    later = [a.time for a in paused.arrivals[1:]]
    assert len(later) == 3
    assert min(later) >= refused_at + 2.95
    # The other host was never held by the pause: all of it arrived while the
    # paused host was still waiting (an order at the server, not a speed).
    assert max(a.time for a in other.arrivals) < min(later)
    assert throttle.slot("127.0.0.2").snapshot().pauses == 1


async def test_retry_after_http_date_pauses_until_that_date() -> None:
    throttle = fast_throttle()
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as client:
        until = email.utils.formatdate(time.time() + 2.0, usegmt=True)
        await client.get(host.url("/status/503"), params={"h.Retry-After": until})
        refused_at = host.arrivals[0].time
        await client.get(host.url("/next"))
    # HTTP dates have one-second resolution: at least one whole second passes.
    assert host.arrivals[1].time >= refused_at + 0.95


async def test_aiohttp_obeys_retry_after() -> None:
    throttle = fast_throttle()
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        async with session.get(host.url("/status/429?h.Retry-After=1")) as response:
            assert response.status == 429
        async with session.get(host.url("/next")) as response:
            assert response.status == 200
    assert host.arrivals[1].time >= host.arrivals[0].time + 0.95


async def test_hostile_retry_after_is_capped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    # A max_delay below max_pause: the gap below is the capped pause's, not the
    # backoff's (at 5 s it would hold with no pause at all, and took 11 s).
    throttle = fast_throttle(max_pause=1.0, max_delay=0.25)
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as client:
        await client.get(host.url("/status/429?h.Retry-After=99999999999"))
        await client.get(host.url("/status/200?h.Retry-After=-5"))
        await client.get(host.url("/status/200?h.Retry-After=soon"))
        await client.get(host.url("/next"))
    gap = host.arrivals[-1].time - host.arrivals[0].time
    assert 0.95 <= gap < 30.0
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "capped to max_pause" in messages
    assert "127.0.0.2" in messages


async def test_a_burst_of_429s_backs_off_once() -> None:
    throttle = fast_throttle()
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as client:
        # Six requests in flight together, all refused: the concurrency lag of one overload.
        responses = await asyncio.gather(
            *(client.get(host.url(f"/status/429?wait=200&n={i}")) for i in range(6))
        )
        assert [r.status_code for r in responses] == [429] * 6
        snap = throttle.slot("127.0.0.2").snapshot()
        assert snap.backoffs == 1
        assert snap.ignored_backoffs == 5
        # A refusal of a request sent after the backoff is new evidence.
        await client.get(host.url("/status/429"))
        assert throttle.slot("127.0.0.2").snapshot().backoffs == 2


async def test_503_backs_off_and_strict_scrapy_does_not() -> None:
    for strict, expected_backoffs in ((False, 1), (True, 0)):
        throttle = Throttle(start_delay=0.1, strict_scrapy=strict)
        async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as client:
            await client.get(host.url("/status/503?h.Retry-After=1"))
            snap = throttle.slot("127.0.0.2").snapshot()
        assert snap.backoffs == expected_backoffs
        assert (snap.pause_remaining > 0) is not strict


async def test_dropped_connection_backs_off_without_a_latency_sample() -> None:
    throttle = fast_throttle(start_delay=0.05)
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as client:
        with pytest.raises(httpx.TransportError):
            await client.get(host.url("/close"))
    snap = throttle.slot("127.0.0.2").snapshot()
    assert snap.failures == 1
    assert snap.backoffs == 1
    assert snap.last_backoff_reason is not None and snap.last_backoff_reason.startswith("failure")
    assert snap.last_latency is None
    assert snap.in_flight == 0


async def test_refused_connection_backs_off_with_aiohttp() -> None:
    throttle = fast_throttle(start_delay=0.05)
    async with ThrottledSession(throttle=throttle) as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            # Port 9 on a loopback address nobody listens on: refused at once.
            async with session.get("http://127.0.0.9:9/"):
                pass
    snap = throttle.slot("127.0.0.9").snapshot()
    assert snap.failures == 1
    assert snap.backoffs == 1
    assert snap.in_flight == 0


async def test_rate_limit_headers_keep_the_rate_within_budget() -> None:
    rate = 5.0
    # A start delay leaves room for the first answer to say what the budget is.
    throttle = fast_throttle(start_delay=0.2)
    async with SimServer({"127.0.0.2": RateLimited(rate=rate, burst=2)}) as sim:
        async with AsyncThrottledClient(throttle=throttle) as client:
            await asyncio.gather(*(client.get(sim.url("127.0.0.2", f"/p/{i}")) for i in range(15)))
        truth = sim.host_stats("127.0.0.2")
    assert truth.requests == 15
    # Spent at the advertised pace: at most the burst over the rate in any second,
    # and hardly a refusal (a generous bound: the server's clock and ours differ).
    assert truth.max_in_window <= rate + 2
    assert truth.limited <= 2


async def test_cache_hits_lower_the_delay_only_through_the_share_of_misses() -> None:
    """The hits must be fast, as the site serves them (1 ms), for the share alone
    to set the delay: a hit that got slow raises it (docs/signals.md, "Caches"),
    and the first hit's latency is all the average knows. The site runs on the
    test's own loop, so on two busy cores (load 19) a hit that waited in the
    run queue was timed at some 75 ms and held the delay at 56 ms for 39. Run
    ahead of the ordinary processes (``promptly``), the test's thread times
    what the site did."""
    site = CDN(hit_ratio=0.5, origin=Capacity(2, 0.05), edge_time=0.001)
    throttle = Throttle(policy=AutoThrottlePolicy(), start_delay=0.3, max_concurrency=2)
    async with SimServer({"127.0.0.2": site}) as sim:
        paths = [f"/p/{i}" for i in range(200)]
        miss = next(p for p in paths if not site.is_hit(p))
        hits = [p for p in paths if site.is_hit(p)][:4]
        async with AsyncThrottledClient(throttle=throttle) as client:
            with promptly():
                response = await client.get(sim.url("127.0.0.2", miss))
                assert response.headers["X-Cache"].startswith("MISS")
                after_miss = throttle.slot("127.0.0.2").delay
                for path in hits:
                    response = await client.get(sim.url("127.0.0.2", path))
                    assert response.headers["X-Cache"].startswith("HIT")
    snap = throttle.slot("127.0.0.2").snapshot()
    assert snap.cache_hits == 4
    # One miss in five responses: the delay is a fifth of the miss's, whatever
    # the hits' own latency (docs/signals.md, "Caches").
    assert record_of(throttle.slot("127.0.0.2")).miss_share == pytest.approx(0.2)
    assert snap.delay == pytest.approx(after_miss * 0.2)


async def test_token_bucket_with_retry_after_only_settles_near_its_rate() -> None:
    """Direction only, with generous bounds; benchmarks/adaptive.py measures it."""
    rate = 20.0
    site = RateLimited(rate=rate, burst=2, headers=False)
    throttle = Throttle(start_delay=0.2, max_delay=5.0, target_concurrency=2.0)
    deadline = time.monotonic() + 6.0
    async with SimServer({"127.0.0.2": site}) as sim:
        async with AsyncThrottledClient(throttle=throttle) as client:

            async def worker(n: int) -> None:
                i = 0
                while time.monotonic() < deadline and i < 1000:
                    await client.get(sim.url("127.0.0.2", f"/w{n}/{i}"))
                    i += 1

            await asyncio.gather(*(worker(n) for n in range(8)))
        truth = sim.host_stats("127.0.0.2")
    refused_share = truth.limited / truth.requests
    # Six seconds hold the whole learning (two or three refusals, a second's
    # pause each): a fifth of the rate says it paces rather than stalls.
    assert truth.ok >= 0.2 * rate * 6.0
    assert refused_share <= 0.2
