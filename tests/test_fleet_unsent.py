"""A fleet turn whose request never reached its host goes back whole (the
fleet's rules 1 and 8, ``docs/fleet.md``, "A request that never reached its host").

A request takes its fleet turn, then connects. A connection that fails
before the request is written (refused here: a bound port that does not
listen; a connect timeout, a name not found) carried nothing to the host: the
turn goes back as one no request took, its time too when nobody reserved
after it, as a request given up at its due time hands it back. Sent, the
turn's time stays spent. Real Redis on 127.0.0.1:6379 (a prefix per test),
real loopback sockets, each client through its adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import httpx
import pytest
import redis
import requests
import urllib3

from autothrottle import FixedRatePolicy, Throttle, _fleet
from autothrottle.aiohttp import ThrottledSession as AiohttpSession
from autothrottle.httpx import AsyncThrottledClient, AsyncThrottledTransport, ThrottledClient
from autothrottle.redis import RedisStore
from autothrottle.requests import ThrottledSession as RequestsSession
from helpers import arrival_site, connected, needs_redis
from redis_keys import fresh_prefix

REDIS = "redis://127.0.0.1:6379/0"
HOST = "127.0.0.2"
GAP = 5.0
"""The fleet's gap: FixedRatePolicy(0.2). A turn's time kept is 5 s of the
slot's next free time; handed back, it is not there."""


@pytest.fixture(autouse=True)
def _needs_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    needs_redis()
    # The turn goes at its due however late a loaded machine wakes it there: what
    # is tested is what follows (a late turn is handed back by rule 1 anyway).
    monkeypatch.setattr(_fleet, "LATE_TOLERANCE", 60.0)


@contextlib.contextmanager
def refusing(address: str) -> Iterator[int]:
    """A port on ``address`` that refuses connections (bound, not listening),
    kept bound meanwhile so that nothing else takes it."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        yield sock.getsockname()[1]


class Keys:
    """The slot's keys in Redis, under the test's prefix."""

    def __init__(self, prefix: str, host: str = HOST) -> None:
        self.admin = redis.Redis.from_url(REDIS)
        self.state, self.leases = f"{{{prefix}:{host}}}:s", f"{{{prefix}:{host}}}:l"

    def tat(self) -> float:
        """The slot's next free time, in Redis's microseconds."""
        return float(self.admin.hget(self.state, "tat") or 0)

    def ahead(self) -> float:
        """Seconds the slot's next free time lies past Redis's now."""
        seconds, micros = self.admin.time()
        now = seconds * 1e6 + micros
        return (float(self.admin.hget(self.state, "tat") or 0) - now) / 1e6

    def leases_held(self) -> int:
        return int(self.admin.zcard(self.leases))


def fleet(gap: float = GAP, prefix: str = "test-unsent") -> tuple[RedisStore, Throttle, Keys]:
    prefix = fresh_prefix(prefix)  # its keys deleted when the test ends (conftest)
    store = RedisStore(REDIS, prefix=prefix, timeout=5.0)
    return store, Throttle(policy=FixedRatePolicy(1 / gap), store=store), Keys(prefix)


async def send_async(client: str, throttle: Throttle, url: str) -> None:
    if client == "httpx":
        async with AsyncThrottledClient(throttle=throttle) as session:
            await session.get(url)
    else:
        async with AiohttpSession(throttle=throttle) as aiohttp_session:
            await aiohttp_session.get(url)


def send_blocking(client: str, throttle: Throttle, url: str) -> None:
    if client == "httpx-sync":
        with ThrottledClient(throttle=throttle) as session:
            session.get(url)
    else:
        with RequestsSession(throttle=throttle) as requests_session:
            requests_session.get(url, timeout=10)


REFUSED = {
    "httpx": httpx.ConnectError,
    "aiohttp": aiohttp.ClientConnectorError,
    "httpx-sync": httpx.ConnectError,
    "requests": requests.ConnectionError,
}


@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
async def test_a_refused_connection_gives_its_turn_back_with_its_time(client: str) -> None:
    store, throttle, keys = fleet()
    try:
        await connected(store)
        with refusing(HOST) as port, pytest.raises(REFUSED[client]):
            await send_async(client, throttle, f"http://{HOST}:{port}/")
        await store.flush()
        assert keys.leases_held() == 0
        # The next free time is back where the turn was (but for the room a first
        # turn leaves for a new connection, 0.1 s): kept, it lay a gap past it.
        assert keys.ahead() < GAP / 2
        assert throttle.slot(HOST).snapshot().failures == 1  # still the host's failure
    finally:
        await store.aclose()


@pytest.mark.parametrize("client", ["httpx-sync", "requests"])
def test_a_refused_connection_gives_its_turn_back_with_its_time_sync(client: str) -> None:
    store, throttle, keys = fleet()
    try:
        with refusing(HOST) as port, pytest.raises(REFUSED[client]):
            send_blocking(client, throttle, f"http://{HOST}:{port}/")
        store.flush_blocking()
        assert keys.leases_held() == 0
        assert keys.ahead() < GAP / 2
        assert throttle.slot(HOST).snapshot().failures == 1
    finally:
        store.close()


@contextlib.contextmanager
def not_accepting(address: str) -> Iterator[int]:
    """A port on ``address`` whose listener never accepts and whose queue is
    full (one connection waits in it): the system drops a new connection's
    SYN, and the client's connect times out."""
    with socket.socket() as listener:
        listener.bind((address, 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        with socket.create_connection((address, port), 5.0):  # the queue's one place
            yield port


async def test_a_connect_timeout_gives_its_turn_back_with_its_time() -> None:
    # The SYN may reach a host whose queue is full, but no request does.
    store, throttle, keys = fleet()
    try:
        await connected(store)
        timeout = httpx.Timeout(10.0, connect=0.3)
        with not_accepting(HOST) as port, pytest.raises(httpx.ConnectTimeout):
            async with AsyncThrottledClient(throttle=throttle, timeout=timeout) as client:
                await client.get(f"http://{HOST}:{port}/")
        await store.flush()
        assert keys.leases_held() == 0
        assert keys.ahead() < GAP / 2
    finally:
        await store.aclose()


def test_a_connect_timeout_gives_its_turn_back_with_its_time_requests() -> None:
    store, throttle, keys = fleet()
    try:
        with (
            not_accepting(HOST) as port,
            pytest.raises(requests.ConnectTimeout),
            RequestsSession(throttle=throttle) as session,
        ):
            session.get(f"http://{HOST}:{port}/", timeout=(0.3, 10.0))
        store.flush_blocking()
        assert keys.leases_held() == 0
        assert keys.ahead() < GAP / 2
    finally:
        store.close()


async def test_a_request_that_reached_its_host_keeps_its_turns_time() -> None:
    # The rule's other side: a request answered (or failed after it was written)
    # spent its turn, and the next one of the fleet is a gap after it.
    store, throttle, keys = fleet()
    try:
        await connected(store)
        async with arrival_site(HOST) as site, AsyncThrottledClient(throttle=throttle) as client:
            await client.get(site.url)
        await store.flush()
        assert keys.leases_held() == 0
        assert keys.ahead() > GAP / 2
    finally:
        await store.aclose()


def test_each_adapter_names_the_errors_of_a_connection_never_made() -> None:
    # What each client raises when the connection was never made: the connect
    # phase's own errors, not a failure after the request was written.
    from autothrottle._httpx._async import _PLUG as HTTPX_PLUG
    from autothrottle.aiohttp import _PLUG as AIOHTTP_PLUG
    from autothrottle.requests import _PLUG as REQUESTS_PLUG

    assert HTTPX_PLUG.unconnected(httpx.ConnectError("refused"))
    assert HTTPX_PLUG.unconnected(httpx.ConnectTimeout("slow"))
    assert not HTTPX_PLUG.unconnected(httpx.ReadError("reset"))
    assert not HTTPX_PLUG.unconnected(httpx.ReadTimeout("slow"))
    assert not HTTPX_PLUG.unconnected(httpx.WriteError("reset"))
    key: Any = SimpleNamespace(host=HOST, port=80, ssl=False)  # what the error reads of a key
    assert AIOHTTP_PLUG.unconnected(aiohttp.ClientConnectorError(key, OSError(111, "refused")))
    assert AIOHTTP_PLUG.unconnected(aiohttp.ConnectionTimeoutError("slow"))
    assert not AIOHTTP_PLUG.unconnected(aiohttp.ServerDisconnectedError())
    assert not AIOHTTP_PLUG.unconnected(aiohttp.SocketTimeoutError("slow read"))
    assert REQUESTS_PLUG.unconnected(requests.ConnectTimeout("slow"))
    refused = urllib3_refused()
    assert REQUESTS_PLUG.unconnected(requests.ConnectionError(refused))
    assert not REQUESTS_PLUG.unconnected(requests.ConnectionError("Connection aborted."))
    assert not REQUESTS_PLUG.unconnected(requests.ReadTimeout("slow"))


def urllib3_refused() -> Exception:
    """urllib3's error for a refused connection, as requests wraps it."""
    import urllib3

    reason = urllib3.exceptions.NewConnectionError(None, "refused")  # type: ignore[arg-type]
    return urllib3.exceptions.MaxRetryError(None, "/", reason)  # type: ignore[arg-type]


async def test_a_refused_connection_leaves_the_sent_turns_of_others_alone() -> None:
    # Handed back with another process's turn reserved after it, only the lease
    # goes: the other's time stays where it was (GIVE_BACK's "final").
    store, throttle, keys = fleet()
    other = RedisStore(REDIS, prefix=store.prefix, timeout=5.0)
    try:
        await connected(store)
        take = store.take_turn

        async def then_another(*args: object, **kwargs: object) -> object:
            turn = await take(*args, **kwargs)  # type: ignore[arg-type]
            if args[0] == HOST:
                ask = _fleet.TurnAsk(GAP, 0.0, 60.0, 8, 300.0, 300.0, _fleet.SPACING_MARGIN)
                assert (await other.take_turn(HOST, ask, 0.0)).lease is not None
                await other.flush()
            return turn

        store.take_turn = then_another  # type: ignore[method-assign, assignment]
        with refusing(HOST) as port, pytest.raises(httpx.ConnectError):
            await send_async("httpx", throttle, f"http://{HOST}:{port}/")
        await store.flush()
        assert keys.leases_held() == 1  # the other's turn only
        assert keys.ahead() > GAP  # its time, after ours, is still reserved
    finally:
        await store.aclose()
        await other.aclose()


class Unwired(Exception):
    """What a plug's wiring raises in these tests: before the client had the request."""


def unwired(*args: object) -> object:
    raise Unwired


@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
async def test_a_request_whose_wiring_raised_gives_its_turn_back_with_its_time(
    client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plug's wire step raised (httpx: making the origin's pool; aiohttp's
    # middleware, the request's or the trace's place for the exchange): the
    # client never had the request, and the turn goes back whole.
    if client == "httpx":
        from autothrottle._httpx._async import _PLUG as HTTPX_PLUG

        monkeypatch.setattr(type(HTTPX_PLUG), "wire", unwired)
    else:
        import autothrottle.aiohttp as throttled_aiohttp

        monkeypatch.setattr(throttled_aiohttp, "_traced", True)
        monkeypatch.setattr(throttled_aiohttp, "EXCHANGE", SimpleNamespace(set=unwired))
    store, throttle, keys = fleet()
    try:
        await connected(store)
        async with arrival_site(HOST) as site:
            with pytest.raises(Unwired):
                await send_async(client, throttle, site.url)
            assert site.arrivals == []
        await store.flush()
        assert keys.leases_held() == 0
        assert keys.ahead() < GAP / 2  # kept, it lay a gap ahead
        assert throttle.slot(HOST).snapshot().failures == 0  # not the host's
    finally:
        await store.aclose()


def test_a_request_whose_wiring_raised_gives_its_turn_back_with_its_time_sync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autothrottle.requests import _PLUG as REQUESTS_PLUG

    monkeypatch.setattr(type(REQUESTS_PLUG), "wire", unwired)
    store, throttle, keys = fleet()
    try:
        with refusing(HOST) as port, pytest.raises(Unwired):
            send_blocking("requests", throttle, f"http://{HOST}:{port}/")
        store.flush_blocking()
        assert keys.leases_held() == 0
        assert keys.ahead() < GAP / 2
        assert throttle.slot(HOST).snapshot().failures == 0
    finally:
        store.close()


class StuckConnector(aiohttp.TCPConnector):
    """A connector whose connections never come: ``connecting`` is set once a
    request waits in ``connect``, with its turn taken."""

    def __init__(self) -> None:
        super().__init__()
        self.connecting = asyncio.Event()

    async def connect(self, *args: object, **kwargs: object) -> aiohttp.connector.Connection:
        self.connecting.set()
        await asyncio.Event().wait()  # until cancelled
        raise AssertionError("unreachable")


async def test_a_request_cancelled_while_it_connects_gives_its_turn_back_with_its_time() -> None:
    # aiohttp: the request was cancelled in its connector's connect (a caller's
    # timeout, a crawl shutting down), before its wire turn: nothing went.
    store, throttle, keys = fleet()
    try:
        await connected(store)
        connector = StuckConnector()
        async with AiohttpSession(throttle=throttle, connector=connector) as session:
            sending = asyncio.ensure_future(session.get(f"http://{HOST}:9/"))
            await asyncio.wait_for(connector.connecting.wait(), 30.0)
            sending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sending
        await store.flush()
        assert keys.leases_held() == 0
        assert keys.ahead() < GAP / 2  # kept, it lay a gap ahead
        assert throttle.slot(HOST).snapshot().failures == 0  # a cancellation is nobody's
    finally:
        await store.aclose()


tls = pytest.importorskip("tls")  # trustme: a handshake a test holds back


@pytest.fixture(scope="module")
def tls_site() -> Iterator[Any]:
    with tls.tls_host("h1", HOST) as served:
        yield served


async def close_what_httpcore_left(cancelled: BaseException) -> None:
    """Close the connection of a TLS handshake that ``cancelled`` ended.

    httpcore (and httpcore2) close the TCP stream of a handshake that raised an
    ``Exception``, not of one cancelled (``docs/adapters.md``): its socket stays
    open until the garbage collector takes it, and under ``-W
    error::ResourceWarning`` whichever test runs then fails. Nothing of the
    throttle holds it; the stream is found in the frames the cancellation left.
    """
    trace = cancelled.__traceback__
    while trace is not None:
        frame = trace.tb_frame
        if frame.f_code.co_name == "start_tls" and "httpcore" in frame.f_code.co_filename:
            await frame.f_locals["self"].aclose()
        trace = trace.tb_next


async def connecting(host: Any, send: Any) -> None:
    """Run ``send`` until its connection is being made (the front accepted it
    and holds its TLS handshake: counted, no clock), then cancel it."""
    sending = asyncio.ensure_future(send)
    for _ in range(3_000):  # bounded: 30 s of 10-ms looks
        if host.connections or sending.done():
            break
        await asyncio.sleep(0.01)
    assert host.connections == 1 and not sending.done()
    sending.cancel()
    with pytest.raises(asyncio.CancelledError) as cancelled:
        await sending
    await close_what_httpcore_left(cancelled.value)


@pytest.mark.parametrize("route", ["client", "client with a trace of its own", "transport"])
async def test_an_httpx_request_cancelled_while_it_connects_gives_its_turn_back_with_its_time(
    tls_site: Any, route: str
) -> None:
    # Its turn taken, its connection being made (the TLS handshake held): a
    # caller's timeout, a crawl shutting down. Nothing of it was written.
    store, throttle, keys = fleet()
    tls_site.forget()
    tls_site.hold(60_000)
    extensions: dict[str, Any] = {}
    if "trace" in route:

        async def trace(name: str, info: dict[str, Any]) -> None:
            pass

        extensions["trace"] = trace
    if route == "transport":
        inner = httpx.AsyncHTTPTransport(verify=tls.trusting())
        transport = AsyncThrottledTransport(inner, throttle=throttle)
        client: httpx.AsyncClient = httpx.AsyncClient(transport=transport)
    else:
        client = AsyncThrottledClient(throttle=throttle, verify=tls.trusting())
    try:
        await connected(store)
        async with client:
            await connecting(tls_site, client.get(tls_site.url(), extensions=extensions))
        await store.flush()
        assert tls_site.arrivals == []
        assert keys.leases_held() == 0
        assert keys.ahead() < GAP / 2  # kept, it lay a gap ahead
        assert throttle.slot(HOST).snapshot().failures == 0  # a cancellation is nobody's
    finally:
        tls_site.hold()
        await store.aclose()


@pytest.mark.parametrize("where", ["for a turn to open a connection", "behind its origin's first"])
async def test_an_httpx_request_cancelled_before_its_connection_gives_its_turn_back_with_its_time(
    tls_site: Any, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first request holds its connection's TLS handshake; the second,
    # a gap later, waits for it: for the client's one turn to open a connection
    # (at most LIMIT being opened at once), or, through a transport of the
    # user's wrapping httpx's own (HTTP/2 not known to be off), behind the first
    # request of its origin until that one's headers are out. Cancelled there,
    # it was never handed to its pool: its turn goes back whole, and the first
    # one's stays spent.
    from autothrottle._httpx import _pools

    gap = 2.0
    store, throttle, keys = fleet(gap)
    tls_site.forget()
    tls_site.hold(60_000)
    waiting = asyncio.Event()
    client: httpx.AsyncClient
    if where.startswith("for a turn"):
        monkeypatch.setattr(_pools.Openings, "LIMIT", 1)
        enter = _pools.Openings.enter

        async def spied(openings: Any, request: httpx.Request) -> None:
            if openings._async is not None and openings._async.value == 0:
                waiting.set()
            await enter(openings, request)

        monkeypatch.setattr(_pools.Openings, "enter", spied)
        client = AsyncThrottledClient(throttle=throttle, verify=tls.trusting())
    else:
        serial_enter = _pools.Serials.enter

        async def spied_serial(serials: Any, url: httpx.URL) -> Any:
            if serials._table:
                waiting.set()
            return await serial_enter(serials, url)

        monkeypatch.setattr(_pools.Serials, "enter", spied_serial)
        inner = httpx.AsyncHTTPTransport(verify=tls.trusting())

        class Wrapping(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                return await inner.handle_async_request(request)

        client = httpx.AsyncClient(transport=AsyncThrottledTransport(Wrapping(), throttle=throttle))
    try:
        await connected(store)
        async with client:
            first = asyncio.ensure_future(client.get(tls_site.url("/1")))
            second = asyncio.ensure_future(client.get(tls_site.url("/2")))
            await asyncio.wait_for(waiting.wait(), 30.0)
            await asyncio.sleep(0)  # into its wait
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            await store.flush()
            # The first turn's time is still reserved, the second's is not:
            # kept, the next free time would lie a gap past the second's due.
            assert keys.ahead() < gap / 2
            assert keys.leases_held() == 1
            first.cancel()
            with pytest.raises(asyncio.CancelledError) as cancelled:
                await first
            await close_what_httpcore_left(cancelled.value)
        await store.flush()
        assert tls_site.arrivals == []
        assert keys.leases_held() == 0
    finally:
        tls_site.hold()
        await store.aclose()


async def test_a_request_cancelled_at_its_wire_turn_after_the_fleet_let_it_go_gives_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fleet let its turn go (its due time came, the look at the wire found
    # it on time), then the slot's own gate holds it at the wire (a strict
    # pace's arrival guard, a pause of its own): cancelled there, it was never
    # written, and its turn goes back whole.
    from autothrottle._gate import Gate

    holding = asyncio.Event()

    def held_at_the_wire(gate: Gate, hold: Any) -> float:
        holding.set()
        return 60.0

    monkeypatch.setattr(Gate, "wire_wait", held_at_the_wire)
    store, throttle, keys = fleet()
    try:
        await connected(store)
        async with arrival_site(HOST) as site, AsyncThrottledClient(throttle=throttle) as client:
            sending = asyncio.ensure_future(client.get(site.url))
            await asyncio.wait_for(holding.wait(), 30.0)
            sending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sending
            assert site.arrivals == []
        await store.flush()
        assert keys.leases_held() == 0
        assert keys.ahead() < GAP / 2
        assert throttle.slot(HOST).snapshot().failures == 0
    finally:
        await store.aclose()


def test_a_request_interrupted_at_its_wire_turn_after_the_fleet_let_it_go_gives_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sync client's side: the thread sleeps out its wire turn, held there by
    # the slot's gate after the fleet let its turn go, and a Ctrl-C (or any
    # BaseException) ends the sleep: nothing was written, and the turn goes back whole.
    from autothrottle import _exchange
    from autothrottle._gate import Gate

    slept: list[float] = []

    def interrupted(seconds: float) -> None:
        slept.append(seconds)
        raise KeyboardInterrupt

    monkeypatch.setattr(Gate, "wire_wait", lambda gate, hold: 60.0)
    monkeypatch.setattr(_exchange, "time", SimpleNamespace(sleep=interrupted))
    store, throttle, keys = fleet()
    try:
        with socket.socket() as listener:
            listener.bind((HOST, 0))
            listener.listen(1)  # its connection is made, in the queue
            port = listener.getsockname()[1]
            with ThrottledClient(throttle=throttle) as client, pytest.raises(KeyboardInterrupt):
                client.get(f"http://{HOST}:{port}/")
            assert slept == [60.0]  # interrupted in the wire turn's sleep
            connection, _ = listener.accept()
            with connection:
                connection.settimeout(10.0)
                assert connection.recv(1024) == b""  # closed, and nothing written
        store.flush_blocking()
        assert keys.leases_held() == 0
        assert keys.ahead() < GAP / 2  # kept, it lay a gap ahead
        assert throttle.slot(HOST).snapshot().failures == 0
    finally:
        store.close()


@pytest.mark.parametrize(
    "route", ["client", "client, one pool", "transport", "transport of the user's"]
)
async def test_an_httpx_request_cancelled_in_httpcores_pool_gives_its_turn_back_with_its_time(
    route: str,
) -> None:
    # The origin's one connection (limits) is busy with the first request's
    # response, its body unread; the second, its turn come a gap later, waits
    # in httpcore's own pool for it, which reports nothing of that wait.
    # Cancelled there, before its wire turn, nothing of it was written: httpx's
    # own transport (httpcore) writes nothing of a request before its
    # send_request_headers trace event, where the wire turn is taken. A
    # transport of the user's (wrapping httpx's own here) may send as it
    # likes: its turn's time stays spent.
    gap = 2.0
    store, throttle, keys = fleet(gap)
    limits = httpx.Limits(max_connections=1)
    inner = httpx.AsyncHTTPTransport(limits=limits)
    client: httpx.AsyncClient
    if route.startswith("client"):
        one_pool = route == "client, one pool"
        client = AsyncThrottledClient(throttle=throttle, limits=limits, pool_per_host=not one_pool)
    elif route == "transport":
        client = httpx.AsyncClient(transport=AsyncThrottledTransport(inner, throttle=throttle))
    else:

        class Wrapping(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                return await inner.handle_async_request(request)

            async def aclose(self) -> None:
                await inner.aclose()

        client = httpx.AsyncClient(transport=AsyncThrottledTransport(Wrapping(), throttle=throttle))
    try:
        await connected(store)
        async with (
            arrival_site(HOST) as site,
            client,
            client.stream("GET", site.url),  # holds the connection
        ):
            transport: Any = client._transport
            if route == "client":
                (entry,) = transport.inner.pools._origins.values()
                core = entry.pool._pool
            elif route == "client, one pool":
                core = transport.inner._pool
            else:
                core = inner._pool
            queued: list[Any] = core._requests  # httpcore's, sent to their close
            second = asyncio.ensure_future(client.get(site.url))
            for _ in range(3_000):  # bounded: 30 s of 10-ms looks
                if len(queued) == 2 or second.done():
                    break
                await asyncio.sleep(0.01)
            assert len(queued) == 2 and not second.done()  # in the pool, waiting
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            await store.flush()
            assert len(site.arrivals) == 1  # the first only
            assert keys.leases_held() == 1  # the first's, its body unread
            if route == "transport of the user's":
                assert keys.ahead() > gap / 2  # kept: nothing says it was not sent
            else:
                assert keys.ahead() < gap / 2  # kept, it lay a gap past the second's due
        await store.flush()
        assert keys.leases_held() == 0
        assert throttle.slot(HOST).snapshot().failures == 0
    finally:
        await store.aclose()


@contextlib.contextmanager
def half_answering(address: str) -> Iterator[tuple[int, threading.Event]]:
    """A port on ``address`` whose one connection gets a response's headers and a
    byte of its body, the rest held back until the event is set."""
    done = threading.Event()
    with socket.socket() as listener:
        listener.bind((address, 0))
        listener.listen(4)
        listener.settimeout(30.0)

        def answer() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nx")
                done.wait(30.0)
                connection.sendall(b"y")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        try:
            yield listener.getsockname()[1], done
        finally:
            done.set()
            thread.join(30.0)


def interrupt_when_waiting(pool: Any) -> threading.Thread:
    """A thread that interrupts the main thread (SIGUSR1, whose handler the test
    makes raise ``KeyboardInterrupt``, as a Ctrl-C's would) once it waits in
    urllib3's ``pool`` for a connection."""
    main = threading.main_thread().ident
    assert main is not None

    def watch() -> None:
        for _ in range(3_000):  # bounded: 30 s of 10-ms looks, then interrupted anyway
            if pool.pool.not_empty._waiters:
                break
            time.sleep(0.01)
        signal.pthread_kill(main, signal.SIGUSR1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("given_up", ["interrupted", "pool timeout"])
def test_a_requests_request_given_up_in_its_pool_gives_its_turn_back_with_its_time(
    given_up: str,
) -> None:
    # pool_block=True and one connection, held by the first response's unread
    # body: the second request, its turn taken a gap later, waits in urllib3's
    # pool for it. Given up there (a Ctrl-C; urllib3's EmptyPoolError past a
    # pool_timeout, which requests never passes but an adapter of the user's
    # may), it was never given a connection: its turn goes back whole, and the
    # first one's stays spent.
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a signal interrupts the main thread only")
    gap = 1.0
    store, throttle, keys = fleet(gap, prefix="test-a-pool")
    previous = signal.signal(signal.SIGUSR1, raise_interrupt)
    try:
        with (
            half_answering(HOST) as (port, done),
            RequestsSession(throttle=throttle, pool_maxsize=1, pool_block=True) as session,
        ):
            url = f"http://{HOST}:{port}/"
            first = session.get(url, stream=True, timeout=10)  # holds the connection
            store.flush_blocking()
            first_tat = keys.tat()
            adapter: Any = session.get_adapter(url)
            pools = adapter.poolmanager.pools
            (pool,) = [pools[key] for key in pools.keys()]  # noqa: SIM118 (not a dict)
            if given_up == "interrupted":
                watcher = interrupt_when_waiting(pool)
                with pytest.raises(KeyboardInterrupt):
                    session.get(url, timeout=10)
                watcher.join(30.0)
            else:
                pool.urlopen = functools.partial(type(pool).urlopen, pool, pool_timeout=0.2)
                with pytest.raises(urllib3.exceptions.EmptyPoolError):
                    session.get(url, timeout=10)
            store.flush_blocking()
            # Kept, the next free time would lie a gap past the first turn's.
            assert keys.tat() - first_tat < gap / 2 * 1e6
            assert keys.leases_held() == 1  # the first's, its body unread
            done.set()
            if given_up == "interrupted":
                # urllib3 gives its pool back a place for the connection the
                # interrupted request never took: the first's finds it full.
                with contextlib.suppress(urllib3.exceptions.FullPoolError):
                    first.close()
            else:
                assert first.content == b"xy"
        store.flush_blocking()
        assert keys.leases_held() == 0
        assert throttle.slot(HOST).snapshot().failures == 0  # neither is the host's
    finally:
        signal.signal(signal.SIGUSR1, previous)
        store.close()


# -- Scrapy ------------------------------------------------------------------------------

SCRAPY_GAP = 1000.0
"""The fleet's gap in the crawls: a turn's time kept lies about this far past
the crawl's end, whatever a loaded machine makes of its start."""


def scrapy_fleet(prefix: str) -> dict[str, Any]:
    return {
        "AUTOTHROTTLE_POLICY": f"fixed-rate={1 / SCRAPY_GAP}",
        "AUTOTHROTTLE_MAX_DELAY": 2 * SCRAPY_GAP,  # Scrapy's 60 s would cap the gap
        "AUTOTHROTTLE_REDIS_URL": REDIS,
        "AUTOTHROTTLE_REDIS_PREFIX": prefix,
        "RETRY_ENABLED": False,
    }


@contextlib.contextmanager
def silent(address: str) -> Iterator[int]:
    """A port on ``address`` that reads each request and never answers."""
    stop = threading.Event()
    with socket.socket() as listener:
        listener.bind((address, 0))
        listener.listen(4)
        listener.settimeout(0.1)

        def read() -> None:
            taken: list[socket.socket] = []
            while not stop.is_set():  # bounded by the test's end
                with contextlib.suppress(TimeoutError):
                    connection, _ = listener.accept()
                    connection.recv(65536)
                    taken.append(connection)
            for connection in taken:
                connection.close()

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        try:
            yield listener.getsockname()[1]
        finally:
            stop.set()
            thread.join(30.0)


def test_a_scrapy_download_that_never_reached_its_host_gives_its_turn_back(
    tls_site: Any, tmp_path: Path
) -> None:
    # Scrapy takes the wire turn before it connects. A connection refused, or a
    # certificate refused in the TLS handshake, carried nothing of the request:
    # its turn goes back whole. A download timed out after the request was
    # written keeps its turn's time (as does one whose connect timed out:
    # Scrapy raises the same error for both).
    from test_scrapy import crawl
    from test_scrapy_tls import VERIFYING

    prefix = fresh_prefix("test-a-scrapy")
    tls_site.forget()
    with refusing("127.0.0.3") as refused, silent("127.0.0.4") as slow:
        result = crawl(
            tmp_path,
            {**scrapy_fleet(prefix), **VERIFYING},  # the test's authority is not trusted
            [
                {"url": tls_site.url()},
                {"url": f"http://127.0.0.3:{refused}/"},
                {"url": f"http://127.0.0.4:{slow}/", "meta": {"download_timeout": 1}},
            ],
        )
    errors = [outcome.get("error") for outcome in result["outcomes"]]
    assert len(errors) == 3 and None not in errors, result["outcomes"]
    assert tls_site.arrivals == []
    back, kept = [Keys(prefix, HOST), Keys(prefix, "127.0.0.3")], Keys(prefix, "127.0.0.4")
    for keys in [*back, kept]:
        assert keys.leases_held() == 0
    for keys in back:  # kept, it would lie a gap ahead
        assert keys.ahead() < SCRAPY_GAP / 2, keys.state
    assert kept.ahead() > SCRAPY_GAP / 2
    assert result["stats"]["autothrottle/failures"] == 3  # the hosts' failures still


def test_a_scrapy_connect_timed_out_under_the_httpx_handler_gives_its_turn_back(
    tmp_path: Path,
) -> None:
    # Scrapy's experimental httpx download handler (Scrapy 2.19 on) raises its
    # download timeout with httpx's own error as its cause: a ConnectTimeout
    # says the connection was never made (the turn goes back whole), a
    # ReadTimeout that the request went (its time kept). The default handler
    # says neither (the test above).
    from test_scrapy import crawl

    handler = "scrapy.core.downloader.handlers._httpx.HttpxDownloadHandler"
    pytest.importorskip(handler.rsplit(".", 1)[0])
    prefix = fresh_prefix("test-a-scrapy")
    with not_accepting("127.0.0.3") as stuck, silent("127.0.0.4") as slow:
        result = crawl(
            tmp_path,
            {**scrapy_fleet(prefix), "DOWNLOAD_HANDLERS": {"http": handler}},
            [
                {"url": f"http://127.0.0.3:{stuck}/", "meta": {"download_timeout": 1}},
                {"url": f"http://127.0.0.4:{slow}/", "meta": {"download_timeout": 1}},
            ],
        )
    errors = [outcome.get("error") for outcome in result["outcomes"]]
    assert errors == ["DownloadTimeoutError"] * 2, result["outcomes"]
    back, kept = Keys(prefix, "127.0.0.3"), Keys(prefix, "127.0.0.4")
    assert back.leases_held() == kept.leases_held() == 0
    assert back.ahead() < SCRAPY_GAP / 2  # kept, it would lie a gap ahead
    assert kept.ahead() > SCRAPY_GAP / 2
    assert result["stats"]["autothrottle/failures"] == 2  # the hosts' failures still


async def test_a_scrapy_request_held_at_its_wire_turn_at_the_close_gives_its_turn_back(
    tmp_path: Path,
) -> None:
    # Its turn taken, the first request waits for its wire turn when the spider
    # closes, the second for its turn, a gap later: both go back to the
    # scheduler unsent, and their fleet turns go back whole; the close does not
    # wait for them.
    from test_scrapy import crawl

    prefix = fresh_prefix("test-a-scrapy")
    settings = {**scrapy_fleet(prefix), "EXTENSIONS": {"scrapy_wire_hold.HoldAtTheWire": 0}}
    async with arrival_site(HOST) as site:
        two = [{"url": site.url}, {"url": site.url}]
        result = await asyncio.to_thread(crawl, tmp_path, settings, two)
        assert site.arrivals == []
    assert result["stats"]["autothrottle/rescheduled_at_close"] == 2
    keys = Keys(prefix, HOST)
    assert keys.leases_held() == 0
    assert keys.ahead() < SCRAPY_GAP / 2  # kept, it would lie a gap ahead


def scrapy_errors() -> tuple[list[BaseException], list[BaseException]]:
    """What Scrapy 2.13 (Twisted's errors) and 2.14 on (its own, Twisted's as
    their cause) raise for a download that may have written its request (a
    timeout, of the connect or of the response alike), and for one that wrote
    nothing."""
    from OpenSSL import SSL
    from scrapy import exceptions
    from scrapy.utils.misc import load_object
    from service_identity.exceptions import VerificationError
    from twisted.internet import error as twisted_errors
    from twisted.python import failure as twisted_failure
    from twisted.web import client

    # Twisted's errors are untyped: called through Any.
    error: Any = twisted_errors
    Failure: Any = twisted_failure.Failure
    ResponseFailed: Any = client.ResponseFailed
    ResponseNeverReceived: Any = client.ResponseNeverReceived

    def failure(value: BaseException) -> Any:
        try:
            raise value
        except BaseException:
            return Failure()

    def wrapped(kind: str, cause: BaseException) -> BaseException:
        """Scrapy 2.14 on's error for Twisted's ``cause`` (``cause`` itself before)."""
        scrapys = getattr(exceptions, kind, None)
        if scrapys is None:
            return cause
        made: BaseException = scrapys(str(cause))
        made.__cause__ = cause
        return made

    verify_failed = SSL.Error([("SSL routines", "", "certificate verify failed")])
    written: list[BaseException] = [
        error.TimeoutError(),  # 2.13's, whatever was slow
        wrapped("DownloadTimeoutError", error.TimeoutError()),
        error.ConnectionLost(),
        ResponseFailed([failure(error.ConnectionLost())]),
        wrapped("DownloadFailedError", ResponseNeverReceived([failure(error.ConnectionDone())])),
        ResponseNeverReceived([failure(SSL.Error([("SSL routines", "", "unexpected eof")]))]),
        ResponseNeverReceived([failure(verify_failed), failure(error.ConnectionLost())]),
        ResponseNeverReceived([]),
        ValueError("a middleware's own"),
        wrapped("DownloadTimeoutError", httpx.ReadTimeout("")),  # the httpx handler's (2.19 on)
    ]
    never_written: list[BaseException] = [
        wrapped("DownloadConnectionRefusedError", error.ConnectionRefusedError()),
        wrapped("CannotResolveHostError", error.DNSLookupError("no-such.example")),
        error.TCPTimedOutError(),
        error.NoRouteError(),
        error.ConnectingCancelledError(None),  # not the host's failure: a connect cancelled
        load_object("scrapy.core.downloader.handlers.http11.TunnelError")("refused"),
        wrapped("DownloadFailedError", ResponseNeverReceived([failure(verify_failed)])),
        ResponseNeverReceived([failure(VerificationError(errors=[]))]),
        wrapped("DownloadTimeoutError", httpx.ConnectTimeout("")),
    ]
    return written, never_written


def test_scrapy_names_the_errors_of_a_download_never_written() -> None:
    from autothrottle._scrapy_parts import unconnected

    written, never_written = scrapy_errors()
    assert [unconnected(each) for each in written] == [False] * len(written)
    assert [unconnected(each) for each in never_written] == [True] * len(never_written)


async def test_a_scrapy_download_error_hands_its_turn_back_when_nothing_was_written() -> None:
    # The middleware takes the wire turn before Scrapy connects, so every download
    # error comes after it: the turn goes back whole for each error that says
    # nothing was written, the host's failure or not (a connect cancelled), and
    # stays spent for every other. A fleet's turn, recorded where it ends.
    from scrapy import Request, Spider
    from scrapy.utils.test import get_crawler

    from autothrottle._fleet_hooks import HeldTurn
    from autothrottle.scrapy import AutoThrottleMiddleware

    ends: list[str] = []
    turns: Any = SimpleNamespace(
        store=SimpleNamespace(
            released=lambda key, turn: ends.append("spent"),
            late=lambda key, turn: ends.append("back"),
        ),
        left=lambda slot: None,
    )
    crawler = get_crawler(
        Spider, {"AUTOTHROTTLE_ENABLED": False, "AUTOTHROTTLE_POLICY": "fixed-delay=0"}
    )
    # A slot a request (a host's failure backs its slot off: the next would wait).
    downloader = SimpleNamespace(get_slot_key=lambda request: request.url, slots={})
    crawler.engine = cast(Any, SimpleNamespace(downloader=downloader))
    middleware = AutoThrottleMiddleware(crawler)
    written, never_written = scrapy_errors()
    for number, error in enumerate([*written, *never_written]):
        request = Request(f"http://127.0.0.{number + 2}/")
        assert await middleware.process_request(request) is None
        lease = middleware._held[request].exchange.lease
        lease.on_release = HeldTurn(turns, SimpleNamespace(key=HOST), "turn")  # type: ignore[arg-type]
        assert isinstance(error, Exception)
        middleware.process_exception(request, error)
        assert middleware.throttle.slot(request.url).in_flight == 0
    assert ends == ["spent"] * len(written) + ["back"] * len(never_written)
