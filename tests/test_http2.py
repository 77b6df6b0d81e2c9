"""The httpx adapter over HTTP/2: many requests of a slot on one connection.

A loopback hypercorn server speaks HTTP/2 over TLS (``tls.py``); the clients
turn it on with ``http2=True``. httpcore numbers a request's stream before
the trace event where the wire turn waits, and the numbers must go out in
order: the adapter hands an origin's requests to an HTTP/2 pool one at a
time, each once the one before has its headers out
(``_httpx/_pools.py``, ``Serial``). Timing bounds are generous.
"""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from autothrottle import Throttle
from autothrottle.httpx import (
    AsyncThrottledClient,
    AsyncThrottledTransport,
    ThrottledClient,
    ThrottledTransport,
)
from helpers import SpyPolicy, fixed
from httpx_packages import PACKAGES, bind

pytest.importorskip("h2")
pytest.importorskip("hypercorn")
tls = pytest.importorskip("tls")  # trustme


@pytest.fixture(autouse=True, params=PACKAGES)
def package(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return bind(globals(), request, monkeypatch)


@pytest.fixture(scope="module")
def host() -> Any:
    with tls.tls_host("h2", "127.0.0.3") as served:
        yield served


def async_client(throttle: Throttle, route: str) -> httpx.AsyncClient:
    if route == "client":
        return AsyncThrottledClient(throttle=throttle, http2=True, verify=tls.trusting())
    inner: httpx.AsyncBaseTransport = httpx.AsyncHTTPTransport(http2=True, verify=tls.trusting())
    if route == "wrapped":
        inner = wrapping(inner)
    return httpx.AsyncClient(transport=AsyncThrottledTransport(inner, throttle=throttle))


def wrapping(inner: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
    """A transport of the user's that hands every request to ``inner`` (httpx's
    own, HTTP/2 on): nothing of it says HTTP/2 but what its connections negotiate."""

    class Wrapping(httpx.AsyncBaseTransport):  # made here: of the package the test binds
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return await inner.handle_async_request(request)

        async def aclose(self) -> None:
            await inner.aclose()

    return Wrapping()


def wrapping_blocking(inner: httpx.BaseTransport) -> httpx.BaseTransport:
    """:func:`wrapping` for the sync client."""

    class Wrapping(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            return inner.handle_request(request)

        def close(self) -> None:
            inner.close()

    return Wrapping()


def assert_idle(throttle: Throttle, key: str) -> None:
    slot = throttle.slot(key)
    assert (slot.in_flight, slot.queued) == (0, 0)


def assert_spaced(times: list[float], delay: float) -> None:
    """Each arrival at least half ``delay`` after the one before.

    The throttle spaces the wire turns; a client process descheduled between
    one request's turn and its write (80 ms at a load of 9 on two cores)
    sends it beside the next, which the host then sees close together. Half
    the delay tells a paced pair from an unpaced one (a few ms apart) and
    holds on a busy machine."""
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= delay / 2 for gap in gaps), gaps


@pytest.mark.parametrize(
    "route", ["client", "transport", "wrapped", "client with a trace of its own"]
)
async def test_requests_behind_a_slow_handshake_share_one_connection_at_the_delay(
    host: Any, route: str
) -> None:
    # Every request is granted while the one connection is still being opened
    # (600 ms): they leave on it one by one, each at its wire turn, with the
    # streams in order (a request numbered while another waited failed with
    # a protocol error, or a KeyError in httpcore).
    spy = SpyPolicy()
    throttle = fixed(0.2, policy=spy)
    host.forget()
    host.hold(600)
    events: list[str] = []

    async def trace(name: str, info: dict[str, Any]) -> None:
        events.append(name)

    extensions = {"trace": trace} if "trace" in route else {}
    async with async_client(throttle, route.split()[0]) as client:
        responses = await asyncio.gather(
            *(client.get(host.url(f"/{i}"), extensions=extensions) for i in range(4))
        )
    assert [r.http_version for r in responses] == ["HTTP/2"] * 4
    if extensions:  # the caller's own trace saw every request's HTTP/2 events
        assert events.count("http2.send_request_headers.started") == 4
    arrivals = host.arrivals
    assert [a["path"] for a in arrivals] == [f"/{i}" for i in range(4)]
    assert {a["version"] for a in arrivals} == {"2"}
    assert len({a["peer"] for a in arrivals}) == 1  # one connection
    assert_spaced([a["time"] for a in arrivals], 0.2)
    slot = throttle.slot(host.address).snapshot()
    assert (slot.sent, slot.responses, slot.failures) == (4, 4, 0)
    # The handshake is not latency, not even the first request's: the server answers at once.
    # Counted in, the first would be 0.6 s or more; a busy machine adds a few hundred ms at most.
    assert len(spy.latencies) == 4 and max(spy.latencies) < 0.45, spy.latencies
    assert_idle(throttle, host.address)


@pytest.mark.parametrize("route", ["client", "wrapped"])
def test_the_sync_client_keeps_streams_in_order_and_the_delay(host: Any, route: str) -> None:
    throttle = fixed(0.2)
    host.forget()
    host.hold(250)
    client: httpx.Client
    if route == "client":
        client = ThrottledClient(throttle=throttle, http2=True, verify=tls.trusting())
    else:
        inner = wrapping_blocking(httpx.HTTPTransport(http2=True, verify=tls.trusting()))
        client = httpx.Client(transport=ThrottledTransport(inner, throttle=throttle))
    with client, ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda i: client.get(host.url(f"/{i}")), range(4)))
    assert [r.http_version for r in responses] == ["HTTP/2"] * 4
    arrivals = host.arrivals
    assert len({a["peer"] for a in arrivals}) == 1
    assert_spaced(sorted(a["time"] for a in arrivals), 0.2)
    slot = throttle.slot(host.address).snapshot()
    assert (slot.sent, slot.responses, slot.failures) == (4, 4, 0)
    assert_idle(throttle, host.address)


@pytest.mark.parametrize("route", ["client", "transport", "wrapped"])
async def test_the_cap_holds_on_one_multiplexed_connection(host: Any, route: str) -> None:
    throttle = fixed(0.0, max_concurrency=2)
    host.forget()
    async with async_client(throttle, route) as client:
        responses = await asyncio.gather(*(client.get(host.url("/delay/60")) for _ in range(5)))
    assert [r.status_code for r in responses] == [200] * 5
    assert host.max_in_service == 2
    assert len({a["peer"] for a in host.arrivals}) == 1
    assert throttle.slot(host.address).sent == 5
    assert_idle(throttle, host.address)


async def test_a_stream_cancelled_mid_body_releases_its_lease_and_the_others_go_on(
    host: Any,
) -> None:
    throttle = fixed(0.0, max_concurrency=2)
    host.forget()
    async with async_client(throttle, "client") as client:
        reading = asyncio.Event()

        async def read_a_little() -> None:
            async with client.stream("GET", host.url("/stream/100/20")) as response:
                async for _ in response.aiter_bytes():
                    reading.set()
                    await asyncio.sleep(10)  # cancelled here, mid-body

        streaming = asyncio.create_task(read_a_little())
        slot = throttle.slot(host.address)
        async with asyncio.timeout(10):
            await reading.wait()
        assert slot.in_flight == 1
        others = [asyncio.create_task(client.get(host.url(f"/{i}"))) for i in range(3)]
        streaming.cancel()
        with pytest.raises(asyncio.CancelledError):
            await streaming
        async with asyncio.timeout(10):
            responses = await asyncio.gather(*others)
    assert [r.status_code for r in responses] == [200] * 3
    assert len({a["peer"] for a in host.arrivals}) == 1
    snapshot = slot.snapshot()
    assert (snapshot.sent, snapshot.responses, snapshot.failures) == (4, 4, 0)
    assert_idle(throttle, host.address)


# -- a wrapping transport's origin learned to speak HTTP/1.1, then over HTTP/2 ----------


def switching(first: httpx.AsyncBaseTransport) -> Any:
    """A transport of the user's that hands every request to its ``inner``, which
    the test changes between requests (from one speaking HTTP/1.1 to HTTP/2)."""

    class Switching(httpx.AsyncBaseTransport):  # made here: of the package the test binds
        def __init__(self) -> None:
            self.inner = first

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return await self.inner.handle_async_request(request)

    return Switching()


def switching_blocking(first: httpx.BaseTransport) -> Any:
    """:func:`switching` for the sync client."""

    class Switching(httpx.BaseTransport):
        def __init__(self) -> None:
            self.inner = first

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            return self.inner.handle_request(request)

    return Switching()


#: The requests before the four: a slot of their own, the origin the same.
WARM = {"X-AutoThrottle": "slot=warm"}


def assert_in_order_on_one_connection(host: Any, throttle: Throttle, responses: list[Any]) -> None:
    """The four requests sent together after the switch went over HTTP/2 on one
    new connection, the delay apart, and none failed."""
    assert [r.http_version for r in responses] == ["HTTP/2"] * 4
    arrivals = host.arrivals[2:]  # after the HTTP/1.1 request and the first over HTTP/2
    assert len(arrivals) == 4 and {a["version"] for a in arrivals} == {"2"}
    assert len({a["peer"] for a in arrivals}) == 1
    assert_spaced(sorted(a["time"] for a in arrivals), 0.2)
    slot = throttle.slot(host.address).snapshot()
    assert (slot.sent, slot.responses, slot.failures) == (4, 4, 0)
    assert_idle(throttle, host.address)


async def test_an_origin_learned_as_http11_is_handed_over_in_turn_again_once_on_http2(
    host: Any,
) -> None:
    # Learned to speak HTTP/1.1, the origin's requests went straight to the
    # user's transport; once one of them goes out over HTTP/2 (the transport
    # changed), they are handed over one at a time again: granted while a new
    # connection is opened, they leave on it in order (straight to it, two
    # numbered alike failed with a protocol error). The first two go on a slot
    # of their own (``WARM``): the four's is fresh, and grants them all while
    # the connection is being opened.
    throttle = fixed(0.2)
    host.forget()
    user = switching(httpx.AsyncHTTPTransport(verify=tls.trusting()))  # HTTP/1.1 alone
    transport = AsyncThrottledTransport(user, throttle=throttle)
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get(host.url("/1.1"), headers=WARM)).http_version == "HTTP/1.1"
        await user.inner.aclose()
        user.inner = httpx.AsyncHTTPTransport(http2=True, verify=tls.trusting())
        assert (await client.get(host.url("/2"), headers=WARM)).http_version == "HTTP/2"
        await user.inner.aclose()
        user.inner = httpx.AsyncHTTPTransport(http2=True, verify=tls.trusting())
        host.hold(600)  # the new connection's handshake: every request is granted meanwhile
        responses = await asyncio.gather(*(client.get(host.url(f"/{i}")) for i in range(4)))
        await user.inner.aclose()
    assert_in_order_on_one_connection(host, throttle, responses)


def test_the_sync_clients_origin_learned_as_http11_is_handed_over_in_turn_again(
    host: Any,
) -> None:
    throttle = fixed(0.2)
    host.forget()
    user = switching_blocking(httpx.HTTPTransport(verify=tls.trusting()))
    client = httpx.Client(transport=ThrottledTransport(user, throttle=throttle))
    with client, ThreadPoolExecutor(4) as pool:
        assert client.get(host.url("/1.1"), headers=WARM).http_version == "HTTP/1.1"
        user.inner.close()
        user.inner = httpx.HTTPTransport(http2=True, verify=tls.trusting())
        assert client.get(host.url("/2"), headers=WARM).http_version == "HTTP/2"
        user.inner.close()
        user.inner = httpx.HTTPTransport(http2=True, verify=tls.trusting())
        host.hold(600)
        responses = list(pool.map(lambda i: client.get(host.url(f"/{i}")), range(4)))
        user.inner.close()
    assert_in_order_on_one_connection(host, throttle, responses)
