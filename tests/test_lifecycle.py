"""The request lifecycle both adapters share (docs/adapters.md, "The request lifecycle").

Each test drives a real client against a real loopback server, or the engine
with an injected clock, and asserts what the server saw or what the slot holds.
"""

from __future__ import annotations

import asyncio
import importlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx
import pytest
import yarl

from autothrottle import FixedDelayPolicy, Throttle, ThrottleTimeout
from autothrottle._request import host_key
from autothrottle._rules import BACKOFF_FLOOR
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledClient, ThrottledClient
from helpers import wait_until
from httpx_packages import PACKAGES
from loopback import LoopbackHost, loopback_hosts, promptly, running_hosts

ARRIVAL_JITTER = 0.015
"""How early a request may be stamped at the loopback server and still count as
kept apart: the way of one request from its wire turn to the server's stamp
may be longer than the next one's. At real-time priorities on both sides
(``loopback.promptly``, as root) it was under 1 ms on the client and 1.2 ms to
the stamp at most; without them, on two busy cores, either process waited in
the run queue on the way, up to 60 and 49 ms (load 5-12). So every test here
that asserts gaps at a host sends from inside ``promptly()``.
Unpaced, the gaps here are 0-2 ms; the promise (benchmarks/wire_gap.py) is 5 ms."""

THREAD_JITTER = 0.04
"""The same allowance where eight threads send: a thread that took its wire turn
can wait for CPython's GIL before it writes, up to a switch interval (5 ms) for
each other thread that wants it, so on a loaded machine its request reaches the
host late by tens of milliseconds and the next one, on time, looks early (seen
once: a 19 ms gap at a 50 ms pace). Unpaced, the gaps here are 0-20 ms."""

CLIENTS = ["httpx", "aiohttp"]


def key(host: LoopbackHost) -> str:
    return host.address


@asynccontextmanager
async def raw_server(status_line: bytes, address: str = "127.0.0.2") -> AsyncIterator[str]:
    """A keep-alive HTTP/1.1 server that answers every request with ``status_line``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(status_line + b"\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, address, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://{address}:{port}/"
    finally:
        server.close()


async def get_status(client: str, throttle: Throttle, url: str, **kwargs: Any) -> int:
    if client == "httpx":
        async with AsyncThrottledClient(throttle=throttle) as http:
            return (await http.get(url, **kwargs)).status_code
    async with (
        ThrottledSession(throttle=throttle) as session,
        session.get(url, **kwargs) as response,
    ):
        await response.read()
        return response.status


# -- every response the client accepts passes ---------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("status", [600, 999])
async def test_a_status_outside_100_599_is_returned_and_counted(client: str, status: int) -> None:
    throttle = Throttle(start_delay=0.0)
    async with raw_server(b"HTTP/1.1 %d Odd" % status) as url:
        assert await get_status(client, throttle, url) == status
    slot = throttle.slot("127.0.0.2")
    assert slot.in_flight == 0
    assert slot.snapshot().status_counts == {status: 1}


# -- observing fails: release, close, raise -------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_raising_block_classifier_releases_the_slot_and_reaches_the_caller(
    client: str,
) -> None:
    def classifier(status: int, headers: object) -> bool:
        raise LookupError("the caller's own bug")

    throttle = Throttle(start_delay=0.0, max_concurrency=1, block_classifier=classifier)
    async with loopback_hosts(1) as (host,):
        with pytest.raises(LookupError):
            await get_status(client, throttle, host.url("/stream/50/100"))
        assert throttle.slot(key(host)).in_flight == 0
        assert throttle.slot(key(host)).snapshot().failures == 0


# -- what counts as the host's failure ----------------------------------------------


def _refused_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.2:{port}/"  # nothing listens there now


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_refused_connection_is_a_failure_and_backs_off_from_delay_zero(
    client: str,
) -> None:
    throttle = Throttle(start_delay=0.0)
    with pytest.raises((httpx.ConnectError, aiohttp.ClientConnectionError)):
        await get_status(client, throttle, _refused_url())
    slot = throttle.slot("127.0.0.2")
    assert slot.snapshot().failures == 1
    assert slot.delay >= BACKOFF_FLOOR  # twice 0 is 0: the floor makes it slow down
    assert slot.in_flight == 0


async def test_an_error_from_the_callers_own_trace_callback_is_not_the_hosts() -> None:
    def trace(name: str, info: dict[str, Any]) -> None:
        if name.endswith("send_request_headers.started"):
            raise KeyError("the caller's own bug")

    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as http:
        with pytest.raises(KeyError):
            await http.get(host.url("/"), extensions={"trace": trace})
    snap = throttle.slot(key(host)).snapshot()
    assert (snap.failures, snap.backoffs, snap.in_flight) == (0, 0, 0)


async def test_an_invalid_url_under_aiohttp_is_the_callers_error() -> None:
    throttle = Throttle(start_delay=0.0)
    async with ThrottledSession(throttle=throttle) as session:
        with pytest.raises(aiohttp.ClientError):
            await session.get("http://127.0.0.2:99999/")  # port out of range
    for slot in throttle.slots():
        assert (slot.snapshot().failures, slot.in_flight) == (0, 0)


async def test_a_hostless_url_under_httpx_raises_httpxs_own_error() -> None:
    throttle = Throttle(start_delay=0.0)
    async with AsyncThrottledClient(throttle=throttle) as http:
        with pytest.raises(httpx.UnsupportedProtocol):
            await http.get("/no/host")
    assert list(throttle.slots()) == []


# -- one host, one slot ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("spellings", "expected"),
    [
        (["http://[0:0:0:0:0:0:0:1]:8080/", "http://[::1]/", "::1", "[::1]:80"], "::1"),
        (["http://Example.com./a", "example.com", "EXAMPLE.COM.:443"], "example.com"),
    ],
)
def test_one_host_spelled_several_ways_is_one_slot(spellings: list[str], expected: str) -> None:
    assert {host_key(s) for s in spellings} == {expected}


def test_httpx_and_aiohttp_key_a_long_form_ipv6_url_alike() -> None:
    throttle = Throttle()
    url = "http://[0:0:0:0:0:0:0:1]:8080/x"
    from_httpx = throttle.key_for(url, host=httpx.URL(url).host)
    from_aiohttp = throttle.key_for(url, host=yarl.URL(url).raw_host or "")
    assert from_httpx == from_aiohttp == throttle.key_for(url) == "::1"


async def test_aiohttp_reads_options_from_a_trace_request_ctx_object() -> None:
    throttle = Throttle(start_delay=0.0)
    ctx = SimpleNamespace(autothrottle={"slot": "named"}, other_tracer="kept")
    async with (
        loopback_hosts(1) as (host,),
        ThrottledSession(throttle=throttle) as session,
        session.get(host.url("/"), trace_request_ctx=ctx) as response,
    ):
        await response.read()
    assert throttle.slot("named").snapshot().responses == 1


# -- threads and event loops share one throttle -------------------------------------


def test_a_release_in_one_loop_wakes_a_waiter_in_another_thread() -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1)
    held = throttle.try_acquire("shared")
    assert held is not None
    got: list[float] = []

    def waiter() -> None:
        async def main() -> None:
            lease = await throttle.acquire("shared")
            got.append(time.monotonic())
            lease.release()

        asyncio.run(main(), debug=True)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)
    released = time.monotonic()
    asyncio.run(_release_in_a_loop(held))
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert got and got[0] - released < 3.0  # woken by the release, not by a timeout


async def _release_in_a_loop(lease: Any) -> None:
    lease.release()


def test_a_loop_closed_with_a_waiter_queued_does_not_stall_the_slot() -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1)
    held = throttle.try_acquire("shared")
    assert held is not None
    first = asyncio.new_event_loop()
    queued = first.create_task(throttle.acquire("shared"))
    first.run_until_complete(asyncio.sleep(0.05))  # the waiter is queued
    first.close()  # closed without cancelling it
    assert not queued.done()
    assert throttle.slot("shared").queued == 1

    async def later() -> None:
        held.release()
        async with asyncio.timeout(10):
            lease = await throttle.acquire("shared")
        lease.release()

    asyncio.run(later())
    assert throttle.slot("shared").queued == 0


# -- the sync client ------------------------------------------------------------------


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("pool_per_host", [False, True], ids=["one-pool", "pool-per-host"])
def test_eight_threads_over_four_hosts_keep_each_hosts_spacing(
    pool_per_host: bool, package: str
) -> None:
    pytest.importorskip(package)
    adapter = importlib.import_module(f"autothrottle.{package}")
    delay = 0.1
    throttle = Throttle(policy=FixedDelayPolicy(delay), max_concurrency=2)
    client = adapter.ThrottledClient(throttle=throttle, pool_per_host=pool_per_host)
    with running_hosts(4) as hosts, client as http:
        urls = [host.url("/delay/20") for host in hosts for _ in range(6)]
        # The pool's threads start inside, so they inherit the priority: what is
        # left between a turn and its write is the interpreter lock's.
        with promptly(), ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda url: http.get(url).status_code, urls))
        if pool_per_host:
            pools = http._transport.inner.pools
            assert len(pools) == 4  # one pool for each host
    assert statuses == [200] * len(urls)
    for host in hosts:
        assert len(host.arrivals) == 6
        assert min(host.gaps()) >= delay - THREAD_JITTER, host.gaps()
    assert all(slot.in_flight == 0 for slot in throttle.slots())
    if pool_per_host:
        assert len(pools) == 0  # every one closed with the client


def test_a_sync_pool_per_host_with_a_transport_of_your_own_is_refused() -> None:
    with pytest.raises(ValueError, match="pool_per_host"):
        ThrottledClient(throttle=Throttle(), pool_per_host=True, transport=httpx.HTTPTransport())


def test_threads_and_an_async_client_share_one_slot() -> None:
    delay = 0.05
    throttle = Throttle(policy=FixedDelayPolicy(delay))
    with running_hosts(1) as (host,), ThrottledClient(throttle=throttle) as http:

        async def from_async() -> None:
            async with AsyncThrottledClient(throttle=throttle) as client:
                for _ in range(4):
                    await client.get(host.url("/"))

        with promptly(), ThreadPoolExecutor(3) as pool:  # its threads inherit the priority
            done: list[Future[object]] = [pool.submit(asyncio.run, from_async())]
            done += [pool.submit(lambda: [http.get(host.url("/")) for _ in range(4)])]
            for future in done:
                future.result(timeout=60)
    assert len(host.arrivals) == 8
    assert min(host.gaps()) >= delay - ARRIVAL_JITTER, host.gaps()


# -- pacing at the wire ---------------------------------------------------------------


def _pool_of_two(client: str, throttle: Throttle) -> Callable[[], Any]:
    if client == "httpx":
        limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
        return lambda: AsyncThrottledClient(throttle=throttle, limits=limits)
    return lambda: ThrottledSession(throttle=throttle, connector=aiohttp.TCPConnector(limit=2))


async def _fetch(client: str, http: Any, url: str) -> None:
    if client == "httpx":
        (await http.get(url)).raise_for_status()
    else:
        async with http.get(url) as response:
            await response.read()


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "new-connections"])
async def test_a_saturated_pool_never_sends_two_requests_closer_than_the_delay(
    client: str, close: bool
) -> None:
    # The pool has 2 connections. The first two responses take 1.0 and 0.8 s,
    # so both connections come free at about 1.0 s, when two later requests,
    # granted 200 ms apart, are waiting for one: they would leave together.
    # The wire turn keeps them 200 ms apart at the host.
    delay = 0.2
    throttle = Throttle(policy=FixedDelayPolicy(delay), max_concurrency=8)
    query = "?h.Connection=close" if close else ""
    paths = [f"/delay/{ms}{query}" for ms in (1000, 800, 50, 50, 50, 50)]
    async with loopback_hosts(1) as (host,), _pool_of_two(client, throttle)() as http:
        with promptly():  # the gaps at the host are the wire turn's, not the run queue's
            await asyncio.gather(*(_fetch(client, http, host.url(path)) for path in paths))
    assert len(host.arrivals) == len(paths)
    assert min(host.gaps()) >= delay - ARRIVAL_JITTER, host.gaps()
    assert throttle.slot(key(host)).in_flight == 0


@pytest.mark.parametrize("client", CLIENTS)
async def test_cancelled_while_waiting_for_the_wire_leaves_nothing_held(client: str) -> None:
    throttle = Throttle(policy=FixedDelayPolicy(0.5), max_concurrency=8)
    async with loopback_hosts(1) as (host,), _pool_of_two(client, throttle)() as http:
        tasks = [
            asyncio.create_task(_fetch(client, http, host.url("/delay/300"))) for _ in range(4)
        ]
        await asyncio.sleep(0.7)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        slot = throttle.slot(key(host))
        await wait_until(lambda: slot.in_flight == 0 and slot.queued == 0)


# -- bounded waits --------------------------------------------------------------------


async def test_httpxs_pool_timeout_bounds_the_wait_on_a_paused_slot() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as http:
        await http.get(host.url("/status/503?h.Retry-After=30"))
        with pytest.raises(httpx.PoolTimeout) as caught:
            await http.get(host.url("/"), timeout=httpx.Timeout(5.0, pool=0.2))
    assert isinstance(caught.value, ThrottleTimeout)
    assert caught.value.slot == key(host)
    assert len(host.arrivals) == 1  # the second request was never sent
    assert throttle.slot(key(host)).queued == 0


@pytest.mark.parametrize("client", CLIENTS)
async def test_max_wait_fails_fast_in_the_clients_timeout_family(client: str) -> None:
    throttle = Throttle(start_delay=0.0, max_wait=0.2)
    async with loopback_hosts(1) as (host,):
        await get_status(client, throttle, host.url("/status/429?h.Retry-After=30"))
        family = httpx.TimeoutException if client == "httpx" else asyncio.TimeoutError
        with pytest.raises(family):
            await get_status(client, throttle, host.url("/"))
    assert len(host.arrivals) == 1
    slot = throttle.slot(key(host))
    assert (slot.queued, slot.in_flight) == (0, 0)


def test_max_wait_bounds_a_thread_too() -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1)
    held = throttle.acquire_blocking("shared")
    with pytest.raises(ThrottleTimeout):
        throttle.acquire_blocking("shared", max_wait=0.1)
    held.release()
    assert throttle.slot("shared").queued == 0
    throttle.acquire_blocking("shared", max_wait=0.1).release()


@pytest.mark.parametrize("value", [-1.0, "soon", float("nan")])
def test_max_wait_is_validated(value: object) -> None:
    with pytest.raises((TypeError, ValueError), match="max_wait"):
        Throttle(max_wait=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1.0, "soon", float("nan")])
async def test_a_bad_max_wait_on_a_call_is_refused_before_a_turn_is_held(value: object) -> None:
    # The turn is free, so a check after granting it would leave it held.
    throttle = Throttle(start_delay=0.0, max_concurrency=1)
    with pytest.raises((TypeError, ValueError), match="max_wait"):
        await throttle.acquire("host", max_wait=value)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="max_wait"):
        throttle.acquire_blocking("host", max_wait=value)  # type: ignore[arg-type]
    assert throttle.slot("host").in_flight == 0
    lease = throttle.try_acquire("host")  # the one place is free: nothing was held
    assert lease is not None
    lease.release()


async def test_without_request_options_aiohttp_still_paces_at_the_wire() -> None:
    # No TraceConfig at all: the connector hook alone takes the wire turn.
    delay = 0.2
    throttle = Throttle(policy=FixedDelayPolicy(delay), max_concurrency=8)
    connector = aiohttp.TCPConnector(limit=2)
    paths = [f"/delay/{ms}" for ms in (1000, 800, 50, 50, 50, 50)]
    async with (
        loopback_hosts(1) as (host,),
        ThrottledSession(throttle=throttle, connector=connector, request_options=False) as s,
    ):
        assert not s.trace_configs
        with promptly():  # the gaps at the host are the wire turn's, not the run queue's
            await asyncio.gather(*(_fetch("aiohttp", s, host.url(path)) for path in paths))
    assert min(host.gaps()) >= delay - ARRIVAL_JITTER, host.gaps()


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("how", ["extension", "header", "host"])
async def test_max_wait_per_request_and_per_host(client: str, how: str) -> None:
    hosts = {"127.0.0.2": {"max_wait": 0.2}} if how == "host" else None
    throttle = Throttle(start_delay=0.0, hosts=hosts)
    async with loopback_hosts(1) as (host,):
        await get_status(client, throttle, host.url("/status/429?h.Retry-After=30"))
        kwargs: dict[str, Any] = {}
        if how == "header":
            kwargs["headers"] = {"X-AutoThrottle": "max-wait=0.2"}
        elif how == "extension":
            option = {"autothrottle": {"max_wait": 0.2}}
            kwargs["extensions" if client == "httpx" else "trace_request_ctx"] = option
        with pytest.raises(ThrottleTimeout):
            async with asyncio.timeout(10):
                await get_status(client, throttle, host.url("/"), **kwargs)
    assert len(host.arrivals) == 1


@pytest.mark.parametrize("bad", [{"max_wait": -1}, {"max_wait": "soon"}, {"max_wait": True}])
def test_a_bad_max_wait_option_is_refused_naming_it(bad: dict[str, object]) -> None:
    from autothrottle._request import options_from_mapping

    with pytest.raises(ValueError, match="max_wait"):
        options_from_mapping({"autothrottle": bad})
