"""A request's ``max_wait`` bounds its wait for the wire turn too, not only for its turn.

A granted request may still wait before a byte of it is written: for a
connection, then for its turn on the wire (``docs/scheduling.md``, rule 10),
which keeps the slot's spacing and any pause that began after the grant. A
429 with ``Retry-After`` on another request of the slot, answered while this
one waited for a connection, pauses the slot for seconds; the request's
``max_wait`` (0.3 s here) must still hold: it fails at once with the turn's
timeout, nothing sent, nothing held. One with no bound waits the pause out.

Each client is given one connection to the host, so the second request is
granted at once (the slot's delay is 0) and then waits behind the first for
the connection, as a busy pool makes it wait.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import requests
from urllib3.util.retry import Retry

from autothrottle import FixedDelayPolicy, Throttle, ThrottleTimeout
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledClient, ThrottledClient, ThrottlePoolTimeout
from autothrottle.requests import ThrottledHTTPAdapter, ThrottleWaitTimeout
from loopback import LoopbackHost, loopback_hosts, running_hosts

PAUSING = "/status/429?wait=400&h.Retry-After=3"
"""Answered after 400 ms: a 429 that pauses the slot for 3 s (waited out by a
request with no bound)."""

LONG_PAUSE = "/status/429?wait=400&h.Retry-After=30"
"""The same, pausing the slot for 30 s: a bounded request that fails within
:data:`AT_ONCE` failed when the pause was known, not after it, however busy
the machine (a bound of a few seconds against a 3-s pause could flip at load)."""

AT_ONCE = 15.0

BOUND = 0.3


def throttle(bound_on: str) -> Throttle:
    return Throttle(
        policy=FixedDelayPolicy(0.0), max_wait=BOUND if bound_on == "throttle" else None
    )


def assert_nothing_held(limiter: Throttle, host: LoopbackHost) -> None:
    snapshot = limiter.snapshot()[host.address]
    assert snapshot.in_flight == 0
    assert snapshot.queued == 0
    assert [a.path for a in host.arrivals] == ["/status/429"], "the bounded request was sent"


@pytest.mark.parametrize("bound_on", ["request", "throttle"])
async def test_aiohttp_a_pause_past_the_bound_fails_the_request_at_once(bound_on: str) -> None:
    limiter = throttle(bound_on)
    headers = {"X-AutoThrottle": f"max-wait={BOUND}"} if bound_on == "request" else {}
    async with loopback_hosts(1) as (host,):
        connector = aiohttp.TCPConnector(limit=1)
        async with ThrottledSession(throttle=limiter, connector=connector) as session:

            async def pausing() -> int:
                async with session.get(host.url(LONG_PAUSE)) as response:
                    await response.read()
                    return response.status

            first = asyncio.create_task(pausing())
            await asyncio.sleep(0.1)  # the first one holds the connection
            started = time.monotonic()
            with pytest.raises(ThrottleTimeout) as caught:
                async with session.get(host.url("/"), headers=headers) as response:
                    await response.read()
            took = time.monotonic() - started
            assert await first == 429
        assert caught.value.waited == BOUND
        assert took < AT_ONCE, took  # failed when the pause was known, not after it
        assert_nothing_held(limiter, host)


async def test_aiohttp_a_request_with_no_bound_waits_the_pause_out() -> None:
    limiter = throttle("none")
    async with loopback_hosts(1) as (host,):
        connector = aiohttp.TCPConnector(limit=1)
        async with ThrottledSession(throttle=limiter, connector=connector) as session:
            first = asyncio.create_task(session.get(host.url(PAUSING)))
            await asyncio.sleep(0.1)
            started = time.monotonic()
            async with session.get(host.url("/")) as response:
                assert response.status == 200
            assert time.monotonic() - started > 2.0  # the pause, waited out
            (await first).release()


@pytest.mark.parametrize("bound_on", ["request", "throttle"])
async def test_httpx_a_pause_past_the_bound_fails_the_request_at_once(bound_on: str) -> None:
    limiter = throttle(bound_on)
    extensions: Any = {"autothrottle": {"max_wait": BOUND}} if bound_on == "request" else {}
    async with loopback_hosts(1) as (host,):
        async with AsyncThrottledClient(
            throttle=limiter, limits=httpx.Limits(max_connections=1)
        ) as client:
            first = asyncio.create_task(client.get(host.url(LONG_PAUSE)))
            await asyncio.sleep(0.1)
            started = time.monotonic()
            with pytest.raises(ThrottlePoolTimeout) as caught:
                await client.get(host.url("/"), extensions=extensions)
            took = time.monotonic() - started
            assert (await first).status_code == 429
        assert isinstance(caught.value, ThrottleTimeout)
        assert caught.value.waited == BOUND
        assert took < AT_ONCE, took
        assert_nothing_held(limiter, host)


@pytest.mark.parametrize("bound_on", ["request", "throttle"])
def test_sync_httpx_a_pause_past_the_bound_fails_the_request_at_once(bound_on: str) -> None:
    limiter = throttle(bound_on)
    extensions: Any = {"autothrottle": {"max_wait": BOUND}} if bound_on == "request" else {}
    with running_hosts(1) as (host,):
        with ThrottledClient(throttle=limiter, limits=httpx.Limits(max_connections=1)) as client:
            statuses: list[int] = []
            first = threading.Thread(
                target=lambda: statuses.append(client.get(host.url(LONG_PAUSE)).status_code)
            )
            first.start()
            time.sleep(0.1)
            started = time.monotonic()
            with pytest.raises(ThrottlePoolTimeout) as caught:
                client.get(host.url("/"), extensions=extensions)
            took = time.monotonic() - started
            first.join(10)
            assert statuses == [429]
        assert caught.value.waited == BOUND
        assert caught.value.bound == "max_wait"
        assert took < AT_ONCE, took
        assert_nothing_held(limiter, host)


RETRIES: dict[str, Any] = {
    "no": 0,
    "total": Retry(total=2, respect_retry_after_header=False),
    # No read retries: the wire turn's timeout, which urllib3 reads as a read
    # error (its "Connection aborted."), is given up on at once.
    "read=0": Retry(total=None, connect=2, read=0, respect_retry_after_header=False),
}


@pytest.mark.parametrize("retried", ["no", "total", "read=0"])
@pytest.mark.parametrize("bound_on", ["request", "throttle"])
def test_requests_a_pause_past_the_bound_fails_the_request_at_once(
    bound_on: str, retried: str
) -> None:
    """The requests adapter with one blocking connection (``pool_block``): the
    second request waits for it in urllib3's pool, then at the wire. With
    urllib3's ``Retry`` too (its attempts are paced by another path), which
    must not retry the bounded request past its bound."""
    limiter = throttle(bound_on)
    headers = {"X-AutoThrottle": f"max-wait={BOUND}"} if bound_on == "request" else {}
    adapter = ThrottledHTTPAdapter(
        throttle=limiter,
        pool_maxsize=1,
        pool_block=True,
        max_retries=RETRIES[retried],
    )
    with running_hosts(1) as (host,), requests.Session() as session:
        session.mount("http://", adapter)
        statuses: list[int] = []
        first = threading.Thread(
            target=lambda: statuses.append(session.get(host.url(LONG_PAUSE)).status_code)
        )
        first.start()
        time.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(ThrottleWaitTimeout) as caught:
            session.get(host.url("/"), headers=headers)
        took = time.monotonic() - started
        first.join(10)
        assert statuses == [429]
    assert isinstance(caught.value, ThrottleTimeout)
    assert caught.value.waited == BOUND
    assert took < AT_ONCE, took
    assert_nothing_held(limiter, host)


def test_sync_httpx_a_pool_timeout_as_the_bound_is_named_so() -> None:
    """httpx's pool timeout, set by the user, bounds the wire turn as
    ``max_wait`` does, and the error names it: ``"httpx pool timeout"``; a
    ``max_wait`` bound is named ``"max_wait"``."""
    limiter = throttle("none")
    pool = 10.0  # past the wait for httpx's one connection (0.4 s), not the pause
    timeout = httpx.Timeout(5.0, pool=pool)
    with running_hosts(1) as (host,):
        with ThrottledClient(
            throttle=limiter, limits=httpx.Limits(max_connections=1), timeout=timeout
        ) as client:
            statuses: list[int] = []
            first = threading.Thread(
                target=lambda: statuses.append(client.get(host.url(LONG_PAUSE)).status_code)
            )
            first.start()
            time.sleep(0.1)
            with pytest.raises(ThrottlePoolTimeout) as caught:
                client.get(host.url("/"))
            first.join(10)
            assert statuses == [429]
        assert caught.value.waited == pool
        assert caught.value.bound == "httpx pool timeout"
        assert_nothing_held(limiter, host)


@pytest.mark.parametrize("bound_on", ["request", "throttle"])
def test_scrapy_a_pause_past_the_bound_fails_the_request_at_once(
    bound_on: str, tmp_path: Path
) -> None:
    """A real crawl (a subprocess: ``test_scrapy.crawl``): the second request is
    granted at once and held before its wire turn until the first one's 429
    has paused the slot for 30 s (``scrapy_wire_pause.py``: Scrapy gives the
    middleware no connection to wait for). Its ``max_wait``, from its meta or
    the host's settings, holds: it fails with ``ThrottleWaitTimeout`` at its
    wire turn, unsent, nothing held."""
    from test_scrapy import assert_nothing_held as assert_crawl_held_nothing
    from test_scrapy import crawl

    with running_hosts(1) as (host,):
        bounded: dict[str, Any] = {"url": host.url("/")}
        settings: dict[str, Any] = {
            "AUTOTHROTTLE_POLICY": "fixed-delay=0",
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            "RETRY_ENABLED": False,  # the 429 is not retried: the crawl ends with it
            "EXTENSIONS": {"scrapy_wire_pause.PauseBeforeTheWire": 0},
        }
        if bound_on == "request":
            bounded["meta"] = {"autothrottle": {"max_wait": BOUND}}
        else:
            settings["AUTOTHROTTLE_HOSTS"] = {host.address: {"max_wait": BOUND}}
        result = crawl(tmp_path, settings, [{"url": host.url(LONG_PAUSE)}, bounded])
        assert [a.path for a in host.arrivals] == ["/status/429"], "the bounded request was sent"
    outcomes = sorted(result["outcomes"], key=lambda outcome: outcome["url"])
    assert outcomes[0]["error"] == "ThrottleWaitTimeout", outcomes
    assert outcomes[1]["status"] == 429
    stats = result["stats"]
    assert stats["test/paused_before_the_wire"] == 1
    assert stats["test/at_the_wire"] < AT_ONCE  # failed when the pause was known, not after it
    assert stats["autothrottle/timeouts"] == 1
    assert_crawl_held_nothing(result)
