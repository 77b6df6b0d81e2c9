"""The throttled httpx clients' pool per origin: how long an idle origin's
connection is kept, and that it is closed and forgotten after.

The table is tested with a hand-moved time; the clients against real
loopback servers that record the connection each request came on, with the
pools' and the throttle's clocks moved on by hand.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from aiohttp import web

from autothrottle import FixedDelayPolicy, Throttle, ThrottleTimeout
from autothrottle.httpx import AsyncThrottledClient, ThrottledClient
from autothrottle.store import MemoryStore
from httpx_packages import PACKAGES, bind
from loopback import served_here


@pytest.fixture(autouse=True, params=PACKAGES)
def package(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return bind(globals(), request, monkeypatch)


def pools_module(package: str) -> Any:
    return __import__(f"autothrottle._{package}._pools", fromlist=["Pools"])


def table(
    package: str, expiry: float = 5.0, longest: float | None = 60.0, threads: bool = True
) -> Any:
    """A pools table whose pools are plain objects (nothing to close)."""
    return pools_module(package).Pools(object, expiry, longest, threads=threads)


URL = "http://a.test/"


def lease_at(pace: float, pause: float = 0.0) -> Any:
    """A request's lease as the table reads it: its slot's pace, and a pause
    that ends ``pause`` seconds after the slot's last activity."""
    return SimpleNamespace(
        slot=SimpleNamespace(delay=pace, last_activity=100.0, pause_until=100.0 + pause)
    )


# -- the table, on a hand-moved time ----------------------------------------------------


def test_a_host_paced_faster_than_the_expiry_is_kept_for_the_expiry(package: str) -> None:
    pools = table(package)
    assert pools.keep_for(0.0) == 5.0
    assert pools.keep_for(3.0) == 5.0  # 4.5 s: within the expiry


def test_a_host_paced_slower_is_kept_for_its_pace_up_to_the_longest(package: str) -> None:
    pools = table(package)
    assert pools.keep_for(20.0) == pytest.approx(20.0 * pools.PACE_MARGIN)
    assert pools.keep_for(600.0) == 60.0
    assert table(package, longest=None).keep_for(20.0) == 5.0  # limits the user set


def test_an_origin_kept_for_its_pace_outlives_the_expiry_and_then_closes(package: str) -> None:
    pools = table(package)
    first, closing = pools.take(httpx.URL(URL), 0.0, lease_at(20.0))
    assert closing == ()
    pools.done(first)
    assert pools.expired(29.0) == []  # 20 s pace: kept for 30 s
    again, closing = pools.take(httpx.URL(URL), 20.0, lease_at(20.0))
    assert again is first and closing == ()  # the next turn finds it
    pools.done(first)
    assert pools.expired(49.0) == []
    assert pools.expired(50.5) == [first.pool]
    assert len(pools) == 0


def test_the_pace_is_read_when_the_pool_is_found_idle(package: str) -> None:
    pools = table(package)
    lease = lease_at(20.0)
    entry, _ = pools.take(httpx.URL(URL), 0.0, lease)
    pools.done(entry)
    lease.slot.delay = 2.0  # the pace quickened meanwhile: 5 s are enough
    assert pools.expired(6.0) == [entry.pool]


def test_a_pause_longer_than_the_pace_keeps_the_pool_for_the_pause(package: str) -> None:
    pools = table(package)
    entry, _ = pools.take(httpx.URL(URL), 0.0, lease_at(0.1, pause=20.0))
    pools.done(entry)
    assert pools.expired(29.0) == []  # kept for 1.5 x the pause
    assert pools.expired(30.5) == [entry.pool]
    ended, _ = pools.take(httpx.URL(URL), 0.0, lease_at(0.1, pause=-50.0))  # long over
    pools.done(ended)
    assert pools.expired(5.5) == [ended.pool]  # the expiry, as the pace asks


def test_a_short_keep_behind_a_long_one_is_not_held_back(package: str) -> None:
    pools = table(package)
    slow, _ = pools.take(httpx.URL("http://slow.test/"), 0.0, lease_at(30.0))  # kept 45 s
    fast, _ = pools.take(httpx.URL("http://fast.test/"), 1.0)  # kept 5 s
    pools.done(slow)
    pools.done(fast)
    assert pools.expired(4.0) == []  # neither past the expiry
    assert pools.expired(10.0) == [fast.pool]  # the slow one kept for its pace
    assert pools.expired(46.0) == [slow.pool]


@pytest.mark.parametrize("threads", [True, False])
def test_a_pool_still_sending_is_kept_past_its_keep_alive(package: str, threads: bool) -> None:
    pools = table(package, threads=threads)
    entry, _ = pools.take(httpx.URL(URL), 0.0, lease_at(20.0))
    assert pools.expired(100.0) == []  # its request is not done
    pools.done(entry)
    assert pools.expired(100.0 + 30.0) == [entry.pool]


@pytest.mark.parametrize("threads", [True, False])
def test_taking_a_pool_hands_back_the_oldest_idle_past_their_keep_alive(
    package: str, threads: bool
) -> None:
    pools = table(package, threads=threads)
    old, _ = pools.take(httpx.URL("http://old.test/"), 0.0)  # kept 5 s
    pools.done(old)
    kept, closing = pools.take(httpx.URL(URL), 4.0)
    assert closing == ()  # the oldest is still kept
    pools.done(kept)
    entry, closing = pools.take(httpx.URL(URL), 6.0)
    assert entry is kept and closing == [old.pool]  # taken out of the table, to be closed
    assert len(pools) == 1


def test_only_the_sync_clients_table_is_locked(package: str) -> None:
    """The async client's table is used from its event loop's thread alone;
    the sync client's from any thread that sends."""
    throttle = Throttle()
    transport: Any = AsyncThrottledClient(throttle=throttle)._transport
    pools = transport.inner.pools
    assert pools._lock is None
    assert pools.expired(0.0) == [] and pools.clear() == []  # usable without one
    with ThrottledClient(throttle=throttle) as client:
        sync_transport: Any = client._transport
        assert sync_transport.inner.pools._lock is not None


def test_an_origin_is_its_scheme_host_and_port(package: str) -> None:
    pools = table(package)
    entries = []
    for url in ("http://a.test/x?y", "http://a.test:80/z", "https://a.test/", "http://b.test/"):
        entry, _ = pools.take(httpx.URL(url), 0.0)
        pools.done(entry)
        entries.append(entry)
    assert entries[0] is entries[1]  # the default port
    assert len({id(entry) for entry in entries}) == 3
    pools.take(httpx.URL("http://a.test:8080/"), 0.0)
    pools.take(httpx.URL("http://xn--bcher-kva.test/"), 0.0)
    pools.take(httpx.URL("http://bücher.test/"), 0.0)  # the same host, encoded
    assert len(pools) == 5


class Unparsed:
    """An httpx URL as an httpx without the parsed form the pools read would
    give it: its public attributes only."""

    def __init__(self, url: Any) -> None:
        self.scheme, self.host, self.raw_host, self.port = (
            url.scheme,
            url.host,
            url.raw_host,
            url.port,
        )


def test_an_origin_read_without_httpxs_parsed_form_is_the_same_key(package: str) -> None:
    origin_of = pools_module(package).origin_of
    for text in ("http://bücher.test/", "https://xn--bcher-kva.test:443/", "http://[::1]:8080/"):
        url = httpx.URL(text)
        assert not hasattr(Unparsed(url), "_uri_reference")
        assert origin_of(Unparsed(url)) == origin_of(url)
    assert origin_of(Unparsed(httpx.URL("http://bücher.test/")))[1] == "xn--bcher-kva.test"
    pools = table(package)
    entry, _ = pools.take(httpx.URL("http://bücher.test/"), 0.0)
    assert pools.take(Unparsed(httpx.URL("http://bücher.test/")), 0.0)[0] is entry
    assert len(pools) == 1


async def test_a_pool_is_never_kept_past_its_slots_idle_timeout(package: str) -> None:
    throttle = Throttle(store=MemoryStore(idle_timeout=30.0))
    async with AsyncThrottledClient(throttle=throttle) as client:
        pools = client._transport.inner.pools  # type: ignore[attr-defined]
        assert pools.longest == 30.0  # forgotten with the slot, not after it
        assert pools.keep_for(600.0) == 30.0


async def test_a_keep_alive_you_set_is_not_stretched(package: str) -> None:
    limits = httpx.Limits(keepalive_expiry=2.0)
    async with AsyncThrottledClient(throttle=Throttle(), limits=limits) as client:
        pools = client._transport.inner.pools  # type: ignore[attr-defined]
        assert (pools.expiry, pools.longest) == (2.0, 2.0)
        assert pools.keep_for(20.0) == 2.0


# -- the client, against loopback servers ------------------------------------------------


@asynccontextmanager
async def servers(addresses: list[str]) -> AsyncIterator[tuple[list[str], list[tuple[str, int]]]]:
    """A server per address; each request's host and connection (the client's port)."""
    peers: list[tuple[str, int]] = []

    async def ok(request: web.Request) -> web.Response:
        assert request.transport is not None
        host = request.transport.get_extra_info("sockname")[0]
        peers.append((host, request.transport.get_extra_info("peername")[1]))
        return web.Response(text="ok")

    async def limited(request: web.Request) -> web.Response:
        await ok(request)
        return web.Response(status=429, headers={"Retry-After": "20"})

    app = web.Application()
    app.router.add_get("/", ok)
    app.router.add_get("/limited", limited)
    async with served_here(addresses, app) as urls:
        yield urls, peers


@pytest.fixture
def shift(package: str, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Seconds the pools' clock (and a throttle made with :func:`later`) is ahead."""
    moved = [0.0]
    monkeypatch.setattr(
        f"autothrottle._{package}._async.monotonic", lambda: time.monotonic() + moved[0]
    )
    return moved


def paced(every: float, shift: list[float]) -> Throttle:
    """A throttle that sends every ``every`` seconds of the moved clock."""
    return Throttle(
        start_delay=every,
        min_delay=every,
        max_delay=every,
        clock=lambda: time.monotonic() + shift[0],
        store=MemoryStore(idle_timeout=600.0),
    )


async def test_a_host_paced_slower_than_the_keep_alive_keeps_its_connection(
    shift: list[float],
) -> None:
    throttle = paced(20.0, shift)
    async with (
        servers(["127.0.0.2", "127.0.0.3"]) as (urls, peers),
        AsyncThrottledClient(throttle=throttle) as client,
    ):
        await client.get(urls[0])
        await client.get(urls[1])
        shift[0] = 20.0  # the next turn of each, well past httpx's 5 s expiry
        await client.get(urls[1])  # looks at the pools idle past their keep-alive
        await client.get(urls[0])
        assert len(client._transport.inner.pools) == 2  # type: ignore[attr-defined]
    assert len(peers) == 4 and len(set(peers)) == 2, peers  # one connection per host


async def test_a_host_that_asked_for_a_pause_keeps_its_connection_through_it(
    shift: list[float],
) -> None:
    # The adaptive policy's delay stays short; the pause a Retry-After asked
    # for is the host's pace, and the request after it finds its connection.
    throttle = Throttle(
        clock=lambda: time.monotonic() + shift[0], store=MemoryStore(idle_timeout=600.0)
    )
    async with (
        servers(["127.0.0.2", "127.0.0.3"]) as (urls, peers),
        AsyncThrottledClient(throttle=throttle) as client,
    ):
        assert (await client.get(urls[0] + "limited")).status_code == 429
        await client.get(urls[1])
        assert (
            throttle.slot("127.0.0.2").delay
            < 5.0
            < throttle.slot("127.0.0.2").pause_until - (time.monotonic())
        )
        shift[0] = 20.0  # the pause is over, well past httpx's 5 s expiry
        await client.get(urls[1])  # looks at the pools idle past their keep-alive
        await client.get(urls[0])
        assert len(client._transport.inner.pools) == 2  # type: ignore[attr-defined]
    first = [peer for peer in peers if peer[0] == "127.0.0.2"]
    assert len(first) == 2 and len(set(first)) == 1, peers  # one connection


async def test_limits_you_set_keep_their_expiry(shift: list[float]) -> None:
    throttle = paced(20.0, shift)
    limits = httpx.Limits(max_connections=50)  # httpx's 5 s keep-alive, set by the user
    async with (
        servers(["127.0.0.2", "127.0.0.3"]) as (urls, peers),
        AsyncThrottledClient(throttle=throttle, limits=limits) as client,
    ):
        await client.get(urls[0])
        await client.get(urls[1])
        shift[0] = 20.0
        await client.get(urls[1])  # closes the first host's pool, idle past 5 s
        await client.get(urls[0])
    first = [peer for peer in peers if peer[0] == "127.0.0.2"]
    assert len(first) == 2 and len(set(first)) == 2, peers  # a new connection


async def test_a_pool_kept_for_its_pace_is_closed_after_the_longest_keep(
    package: str, shift: list[float]
) -> None:
    throttle = paced(600.0, shift)
    longest = pools_module(package).LONGEST_KEEP_ALIVE
    async with (
        servers(["127.0.0.2", "127.0.0.3"]) as (urls, _),
        AsyncThrottledClient(throttle=throttle) as client,
    ):
        pools = client._transport.inner.pools  # type: ignore[attr-defined]
        await client.get(urls[0])
        first = next(iter(pools._origins.values())).pool
        shift[0] = longest + 1.0
        await client.get(urls[1])  # the first host's pool: idle past the longest keep
        assert len(pools) == 1
        assert first._pool.connections == []  # closed, its connection with it


# -- opening connections: a few at a time ------------------------------------------------


@asynccontextmanager
async def slow_servers(
    addresses: list[str], seconds: float
) -> AsyncIterator[tuple[list[str], list[int]]]:
    """A server per address answering after ``seconds``; the most requests in service at once."""
    busy = [0]
    most = [0]

    async def slow(request: web.Request) -> web.Response:
        busy[0] += 1
        most[0] = max(most[0], busy[0])
        try:
            await asyncio.sleep(seconds)
        finally:
            busy[0] -= 1
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", slow)
    async with served_here(addresses, app) as urls:
        yield urls, most


def opening_limit(package: str, monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    monkeypatch.setattr(pools_module(package).Openings, "LIMIT", limit)


async def test_new_hosts_open_connections_a_few_at_a_time(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opening_limit(package, monkeypatch, 2)
    addresses = [f"127.0.0.{i}" for i in range(2, 8)]
    async with (
        slow_servers(addresses, 0.2) as (urls, most),
        AsyncThrottledClient(throttle=Throttle(start_delay=0.0)) as client,
    ):
        responses = await asyncio.gather(*(client.get(url) for url in urls))
    assert [r.status_code for r in responses] == [200] * len(urls)  # late, not lost
    assert most[0] == 2


async def test_a_request_on_a_kept_connection_does_not_wait_to_open_one(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opening_limit(package, monkeypatch, 1)
    async with (
        slow_servers(["127.0.0.2", "127.0.0.3"], 0.2) as (urls, most),
        AsyncThrottledClient(throttle=Throttle(start_delay=0.0)) as client,
    ):
        await client.get(urls[0])  # its connection is kept
        await asyncio.gather(client.get(urls[0]), client.get(urls[1]))
    assert most[0] == 2  # the first host's request went beside the second's opening


async def test_a_pool_timeout_you_set_bounds_the_wait_to_open(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opening_limit(package, monkeypatch, 1)
    async with (
        slow_servers(["127.0.0.2", "127.0.0.3"], 1.0) as (urls, _),
        AsyncThrottledClient(
            throttle=Throttle(start_delay=0.0), timeout=httpx.Timeout(5.0, pool=0.1)
        ) as client,
    ):
        first = asyncio.ensure_future(client.get(urls[0]))
        await asyncio.sleep(0.3)  # its connection is being opened (and its answer awaited)
        with pytest.raises(httpx.PoolTimeout):
            await client.get(urls[1])
        assert (await first).status_code == 200


async def test_the_sync_client_opens_connections_a_few_at_a_time_too(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opening_limit(package, monkeypatch, 1)
    addresses = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    async with slow_servers(addresses, 0.2) as (urls, most):
        with ThrottledClient(throttle=Throttle(start_delay=0.0)) as client:

            def status(url: str) -> int:
                return client.get(url).status_code

            statuses = await asyncio.gather(*(asyncio.to_thread(status, url) for url in urls))
    assert statuses == [200, 200, 200]
    assert most[0] == 1


async def test_the_sync_client_bounds_the_wait_to_open_by_a_pool_timeout_you_set(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opening_limit(package, monkeypatch, 1)
    timeout = httpx.Timeout(5.0, pool=0.1)
    async with slow_servers(["127.0.0.2", "127.0.0.3"], 1.0) as (urls, _):
        with ThrottledClient(throttle=Throttle(start_delay=0.0), timeout=timeout) as client:
            first = asyncio.ensure_future(asyncio.to_thread(client.get, urls[0]))
            await asyncio.sleep(0.3)  # its connection is being opened
            with pytest.raises(httpx.PoolTimeout):
                await asyncio.to_thread(client.get, urls[1])
            assert (await first).status_code == 200


# -- a request's pool, given back whatever happens to it -----------------------------------


def closed_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
    return port


def sending(client: Any) -> list[int]:
    pools = client._transport.inner.pools
    return [entry.sending for entry in pools._origins.values()]


async def test_a_request_that_fails_or_is_cancelled_gives_its_pool_back() -> None:
    throttle = Throttle(start_delay=0.0)
    refused = f"http://127.0.0.4:{closed_port('127.0.0.4')}/"
    async with (
        slow_servers(["127.0.0.2"], 5.0) as (urls, _),
        AsyncThrottledClient(throttle=throttle) as client,
    ):
        with pytest.raises(httpx.ConnectError):
            await client.get(refused)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await client.get(urls[0])  # cancelled while its pool sends it
        assert sending(client) == [0, 0]  # each pool free to be closed once idle
        assert all(slot.in_flight == 0 for slot in throttle.slots())
    assert throttle.slot("127.0.0.4").snapshot().failures == 1


async def test_a_pool_that_cannot_be_made_fails_the_request_and_releases_its_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    throttle = Throttle(start_delay=0.0)
    async with AsyncThrottledClient(throttle=throttle) as client:
        pools = client._transport.inner.pools  # type: ignore[attr-defined]

        def broken() -> Any:
            raise ImportError("h2 is not installed")

        monkeypatch.setattr(pools, "_make", broken)
        with pytest.raises(ImportError, match="h2"):
            await client.get("http://127.0.0.2:1/")
        assert len(pools) == 0
    slot = throttle.slot("127.0.0.2").snapshot()
    assert (slot.in_flight, slot.sent, slot.failures) == (0, 1, 0)  # the caller's error


def test_the_sync_client_gives_a_failed_requests_pool_back() -> None:
    throttle = Throttle(start_delay=0.0)
    with ThrottledClient(throttle=throttle) as client:
        for _ in range(2):
            with pytest.raises(httpx.ConnectError):
                client.get(f"http://127.0.0.2:{closed_port('127.0.0.2')}/")
        assert sending(client) == [0, 0]
    assert throttle.slot("127.0.0.2").in_flight == 0


# -- a kept connection, used again soon: the wire turn without httpcore's trace ----------


@asynccontextmanager
async def raw_server(
    address: str, seconds: float, *, close_after: bool
) -> AsyncIterator[tuple[str, list[tuple[float, int]]]]:
    """An HTTP/1.1 server answering every request after ``seconds``; each request's
    arrival time and connection. ``close_after``: the server closes each connection
    once it has answered, saying nothing (as one does whose idle timeout ran out)."""
    arrivals: list[tuple[float, int]] = []
    connections = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        connection = connections[0]
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                arrivals.append((time.monotonic(), connection))
                await asyncio.sleep(seconds)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                if close_after:
                    await asyncio.sleep(0.02)  # after the client has read the answer
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client closed it, or the test is over
        finally:
            writer.close()

    server = await asyncio.start_server(serve, address, 0)
    try:
        yield f"http://{address}:{server.sockets[0].getsockname()[1]}/", arrivals
    finally:
        server.close()
        await server.wait_closed()


class Spy(FixedDelayPolicy):
    """A fixed delay that records every latency the throttle learns from."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.latencies: list[float] = []

    def next_delay(self, delay: float, sample: Any, config: Any) -> float:
        self.latencies.append(sample.latency)
        return super().next_delay(delay, sample, config)


def traced(package: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The httpcore events the throttle's own trace is called with, from now on."""
    tracer = __import__(f"autothrottle._{package}._async", fromlist=["_"])._WireTracer
    seen: list[str] = []
    call = tracer.__call__

    async def spy(self: Any, name: str, info: dict[str, Any]) -> None:
        seen.append(name)
        await call(self, name, info)

    monkeypatch.setattr(tracer, "__call__", spy)
    return seen


@pytest.mark.parametrize("close_after", [False, True], ids=["kept", "closed-by-server"])
async def test_a_connection_used_again_soon_takes_the_wire_turn_without_a_trace(
    package: str, monkeypatch: pytest.MonkeyPatch, close_after: bool
) -> None:
    # The idle connection is ready when the request is handed over: with no
    # gap to keep, the wire turn is taken then, with no httpcore event. A
    # server that closed it in the meantime costs a new connection.
    seen = traced(package, monkeypatch)
    spy = Spy(0.0)
    throttle = Throttle(start_delay=0.0, policy=spy)
    async with (
        raw_server("127.0.0.2", 0.06, close_after=close_after) as (url, arrivals),
        AsyncThrottledClient(throttle=throttle) as client,
    ):
        for i in range(4):
            await asyncio.sleep(0.1)  # the server's close, if it closes, has come
            response = await client.get(url)
            assert response.status_code == 200
            if i == 0:  # a new connection: timed from its headers, by the trace
                assert any(name.endswith("send_request_headers.started") for name in seen)
                first = len(seen)
            assert "trace" not in response.request.extensions
        assert sending(client) == [0]
    assert len(seen) == first  # none after the first request
    connections = {connection for _, connection in arrivals}
    assert len(connections) == (4 if close_after else 1)
    assert len(spy.latencies) == 4
    assert all(0.055 <= latency < 5.0 for latency in spy.latencies), spy.latencies
    slot = throttle.slot("127.0.0.2").snapshot()
    assert (slot.in_flight, slot.sent, slot.failures) == (0, 4, 0)


async def test_the_sync_client_sends_on_a_connection_the_server_closed_too() -> None:
    spy = Spy(0.0)
    throttle = Throttle(start_delay=0.0, policy=spy)

    def crawl(url: str) -> list[int]:
        with ThrottledClient(throttle=throttle) as client:
            codes = []
            for _ in range(3):
                time.sleep(0.1)  # the server's close has come
                codes.append(client.get(url).status_code)
            return codes

    async with raw_server("127.0.0.2", 0.06, close_after=True) as (url, arrivals):
        assert await asyncio.to_thread(crawl, url) == [200] * 3
    assert len({connection for _, connection in arrivals}) == 3
    assert all(0.055 <= latency < 5.0 for latency in spy.latencies), spy.latencies
    assert throttle.slot("127.0.0.2").in_flight == 0


async def test_a_spaced_request_on_a_kept_connection_takes_its_wire_turn_at_the_headers(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # httpcore's locks yield to the loop between the hand-over and the
    # headers: a gap to keep is kept from the headers, as on a new connection.
    seen = traced(package, monkeypatch)
    throttle = Throttle(start_delay=0.25, policy=FixedDelayPolicy(0.25))
    async with (
        raw_server("127.0.0.2", 0.0, close_after=False) as (url, arrivals),
        AsyncThrottledClient(throttle=throttle) as client,
    ):
        for _ in range(3):
            assert (await client.get(url)).status_code == 200
        assert sending(client) == [0]
    started = [name for name in seen if name.endswith("send_request_headers.started")]
    assert len(started) == 3
    assert len({connection for _, connection in arrivals}) == 1
    times = [at for at, _ in arrivals]
    assert all(b - a >= 0.25 / 2 for a, b in itertools.pairwise(times)), times  # a lag's slack


def wire_hook(monkeypatch: pytest.MonkeyPatch, hook: Any) -> None:
    """Put ``hook`` on the wire turn of every request granted from now on (the
    seam a fleet's turn uses: seconds to wait yet, or an error)."""
    acquire_now = Throttle.acquire_now

    def hooked(self: Throttle, key: str, *args: Any, **kwargs: Any) -> Any:
        lease = acquire_now(self, key, *args, **kwargs)
        if lease is not None:
            lease.on_wire = lambda: hook(lease)
        return lease

    monkeypatch.setattr(Throttle, "acquire_now", hooked)


@pytest.mark.parametrize("wait", [0.03, 0.3])
async def test_a_wire_turn_still_to_come_on_a_kept_connection_is_waited_for(
    package: str, monkeypatch: pytest.MonkeyPatch, wait: float
) -> None:
    # A short wait (a turn granted early by the lead) is spent before sending
    # on the idle connection; a longer one is traced, as on a new connection.
    seen = traced(package, monkeypatch)
    throttle = Throttle(start_delay=0.0, policy=FixedDelayPolicy(0.0))
    async with (
        raw_server("127.0.0.2", 0.0, close_after=False) as (url, arrivals),
        AsyncThrottledClient(throttle=throttle) as client,
    ):
        await client.get(url)  # a new connection
        first = len(seen)
        until = time.monotonic() + wait

        def later(lease: Any) -> float:
            wait = until - time.monotonic()
            if wait <= 0.0:
                lease.on_wire = None
            return max(wait, 0.0)

        wire_hook(monkeypatch, later)
        assert (await client.get(url)).status_code == 200
        assert sending(client) == [0]
    # Went at its wire turn: not before `until` (from the moment it was set, not
    # from the call, which a loaded machine ran 15 ms later: 0.285 s read short).
    assert arrivals[1][0] >= until - 0.01
    assert len(seen) > first if wait > 0.05 else len(seen) == first
    assert throttle.slot("127.0.0.2").in_flight == 0


async def test_a_wire_turn_that_fails_on_a_kept_connection_sends_nothing_and_gives_all_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    throttle = Throttle(start_delay=0.0, policy=FixedDelayPolicy(0.0))
    async with (
        raw_server("127.0.0.2", 0.0, close_after=False) as (url, arrivals),
        AsyncThrottledClient(throttle=throttle) as client,
    ):
        await client.get(url)

        def past_bound(lease: Any) -> float:
            raise ThrottleTimeout("127.0.0.2", 1.0, "max_wait")

        wire_hook(monkeypatch, past_bound)
        with pytest.raises(httpx.PoolTimeout):  # the client's own kind of timeout
            await client.get(url)
        assert sending(client) == [0]
    assert len(arrivals) == 1
    slot = throttle.slot("127.0.0.2").snapshot()
    assert (slot.in_flight, slot.sent, slot.failures) == (0, 2, 0)


# -- HTTP/2: an origin's requests handed over one at a time, first come first ----------


def test_the_sync_clients_threads_are_handed_the_origin_in_the_order_they_came(
    package: str,
) -> None:
    # Each thread comes only once the one before is counted in (no clock): the
    # holder gives the turn back and asks again at once, as a request of its
    # origin right behind would, and goes after every thread that came before it.
    # A threading.Lock lets the thread that released it take it again first.
    serials = pools_module(package).Serials()
    url = httpx.URL("https://h2.test/")
    held = serials.enter_blocking(url)
    order: list[int] = []

    def request(n: int) -> None:
        serial = serials.enter_blocking(url)
        order.append(n)
        serial.leave()
        serials.done(serial)

    threads = []
    for n in range(1, 6):
        thread = threading.Thread(target=request, args=(n,))
        thread.start()
        threads.append(thread)
        for _ in range(10_000):  # until it is queued: counted, bounded
            if held.users == n + 1:
                break
            time.sleep(0.001)
        assert held.users == n + 1
    held.leave()
    again = serials.enter_blocking(url)  # behind the five
    order.append(0)
    again.leave()
    serials.done(again)
    serials.done(held)
    for thread in threads:
        thread.join(10)
    assert order == [1, 2, 3, 4, 5, 0]
    assert serials.passing(url) is None and held.users == 0


def test_an_origin_learned_to_speak_http11_passes_and_the_learned_are_bounded(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = pools_module(package)
    monkeypatch.setattr(module.Serials, "LEARNED_MOST", 3)
    known, learning = module.Serials(), module.Serials(learn=True)
    urls = [httpx.URL(f"https://{n}.test/") for n in range(4)]
    for serials in (known, learning):
        for url in urls[:3]:
            serial = serials.enter_blocking(url)
            serial.leave(False)  # its headers went out on an HTTP/1.1 connection
            serials.done(serial)
    assert [known.passing(url) for url in urls] == [None] * 4  # HTTP/2 on: never learned
    passes = [learning.passing(url) is not None for url in urls]
    assert passes == [True, True, True, False]
    serial = learning.enter_blocking(urls[3])
    serial.leave(False)
    learning.done(serial)
    passes = [learning.passing(url) is not None for url in urls]
    assert passes == [False, False, False, True]


def test_a_learned_origins_request_on_http2_forgets_it_and_on_http11_keeps_it(
    package: str,
) -> None:
    learning = pools_module(package).Serials(learn=True)
    url = httpx.URL("https://a.test/")
    serial = learning.enter_blocking(url)
    serial.leave(False)
    learning.done(serial)
    passing = learning.passing(url)
    assert passing is not None and learning.passing(httpx.URL("https://a.test/x")) is passing
    passing.leave(False)  # its headers went out on HTTP/1.1: still learned
    assert learning.passing(url) is passing
    passing.leave()  # on HTTP/2: handed over in turn again, until learned again
    assert learning.passing(url) is None
    passing.leave()  # another request passed meanwhile, on HTTP/2 too
    assert learning.passing(url) is None
