"""The httpx adapter against real aiohttp.web servers on loopback addresses.

Each server records when requests arrive and how many are in service at once,
so pacing and the cap are asserted where they matter: at the server. Timing
bounds are one-sided or generous; nothing here asserts speed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from subprocess import PIPE
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from autothrottle import Throttle
from autothrottle._exchange import Exchange
from autothrottle._httpx._async import _WireTracer
from autothrottle.httpx import AsyncThrottledClient, AsyncThrottledTransport, ThrottledClient
from autothrottle.store import MemoryStore
from helpers import SpyPolicy, fixed, left_for_the_collector, wait_until
from httpx_packages import PACKAGES, bind
from loopback import LoopbackHost, loopback_hosts

CONTROL = "x-autothrottle"


@pytest.fixture(autouse=True, params=PACKAGES)
def package(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return bind(globals(), request, monkeypatch)


def client_for(throttle: Throttle, **kwargs: Any) -> httpx.AsyncClient:
    inner = httpx.AsyncHTTPTransport(limits=kwargs.pop("limits", httpx.Limits()))
    return httpx.AsyncClient(transport=AsyncThrottledTransport(inner, throttle=throttle), **kwargs)


def assert_idle(throttle: Throttle, key: str) -> None:
    slot = throttle.slot(key)
    assert (slot.in_flight, slot.queued) == (0, 0)


def assert_spaced(times: list[float], delay: float) -> None:
    """Arrivals at a server ``times`` were sent at least ``delay`` apart.

    An arrival is its send plus a transit through the (shared, loaded) event
    loop, and one transit may lag by tens of ms, which shortens one gap and
    lengthens the next. So every pair of arrivals ``k`` sends apart must be at
    least ``k * delay`` apart, less half a delay of slack: sends at no spacing,
    or at half the delay, still fail.
    """
    assert len(times) >= 2, times
    for i, earlier in enumerate(times):
        for k, later in enumerate(times[i + 1 :], start=1):
            assert later - earlier >= k * delay - delay / 2, (i, k, times)


async def warm_up(client: httpx.AsyncClient, *hosts: LoopbackHost) -> None:
    """Open a connection to each host, unthrottled, and forget those arrivals.

    A client's first request pays one-time costs (imports, a new connection)
    that would shorten the first arrival gap measured at the server.
    """
    for host in hosts:
        await client.get(host.url("/warm-up"), headers={"X-AutoThrottle": "bypass"})
        host.forget_arrivals()


def closed_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
    return port


# -- pacing ------------------------------------------------------------------


async def test_arrivals_are_spaced_by_the_delay() -> None:
    throttle = fixed(0.2)
    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        await warm_up(client, host)
        responses = await asyncio.gather(*(client.get(host.url(f"/{i}")) for i in range(5)))
    assert [r.status_code for r in responses] == [200] * 5
    assert len(host.arrivals) == 5
    assert_spaced(host.arrival_times(), 0.2)
    # FIFO: the requests arrive in the order they were made.
    assert [a.path for a in host.arrivals] == [f"/{i}" for i in range(5)]
    assert_idle(throttle, host.address)


async def test_cap_is_never_exceeded() -> None:
    throttle = fixed(0.0, max_concurrency=3)
    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        responses = await asyncio.gather(*(client.get(host.url("/delay/50")) for _ in range(12)))
    assert all(r.status_code == 200 for r in responses)
    assert len(host.arrivals) == 12
    assert 2 <= host.max_in_service <= 3
    assert throttle.slot(host.address).sent == 12
    assert_idle(throttle, host.address)


async def test_hosts_never_wait_for_each_other() -> None:
    throttle = Throttle(start_delay=0.0, max_delay=1000.0)
    # One connection for the whole client: waiting requests must not hold it.
    limits = httpx.Limits(max_connections=1)
    async with loopback_hosts(2) as (slow, fast), client_for(throttle, limits=limits) as client:
        await client.get(slow.url())
        throttle.slot(slow.address).delay = 600.0
        waiting = [asyncio.create_task(client.get(slow.url("/late"))) for _ in range(3)]
        await wait_until(lambda: throttle.slot(slow.address).queued == 3)
        async with asyncio.timeout(30):
            for i in range(5):
                assert (await client.get(fast.url(f"/{i}"))).status_code == 200
        assert len(fast.arrivals) == 5
        assert throttle.slot(slow.address).queued == 3
        assert len(slow.arrivals) == 1
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
    assert_idle(throttle, slow.address)
    assert_idle(throttle, fast.address)


# -- latency -----------------------------------------------------------------


async def test_latency_excludes_connection_pool_waiting() -> None:
    spy = SpyPolicy()
    throttle = Throttle(start_delay=0.0, max_delay=0.0, policy=spy)
    limits = httpx.Limits(max_connections=1)
    durations: list[float] = []

    async def timed_get(client: httpx.AsyncClient, url: str) -> None:
        started = time.monotonic()
        await client.get(url)
        durations.append(time.monotonic() - started)

    async with loopback_hosts(1) as (host,), client_for(throttle, limits=limits) as client:
        started = time.monotonic()
        await asyncio.gather(*(timed_get(client, host.url("/delay/150")) for _ in range(5)))
        elapsed = time.monotonic() - started
    # The five went through the throttle at once and queued in httpx's pool.
    assert max(durations) >= 0.7
    assert host.max_in_service == 1
    assert len(spy.latencies) == 5
    # Each latency spans its own answer's 150 ms; and the five spans, one
    # connection's turns, never overlap: each starts when the connection is
    # ready, after the answer before it was read. So they add up to no more
    # than the whole run took. Had the pool's waiting counted, the k-th would
    # span the k-1 answers before it too, and they would add up to about
    # three times the run. A bound load cannot flip: a stall lengthens the
    # run by at least as much as it lengthens any span.
    assert all(latency >= 0.14 for latency in spy.latencies), spy.latencies
    assert sum(spy.latencies) <= elapsed, (spy.latencies, elapsed)
    assert throttle.slot(host.address).last_latency in spy.latencies


async def test_latency_excludes_throttle_waiting() -> None:
    spy = SpyPolicy()
    throttle = fixed(0.3, policy=spy)
    durations: list[float] = []

    async def timed_get(client: httpx.AsyncClient, url: str) -> None:
        started = time.monotonic()
        await client.get(url)
        durations.append(time.monotonic() - started)

    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        await asyncio.gather(*(timed_get(client, host.url("/delay/20")) for _ in range(3)))
    assert max(durations) >= 0.55
    assert len(spy.latencies) == 3
    assert all(0.019 <= latency < 0.25 for latency in spy.latencies), spy.latencies


async def test_users_trace_callback_still_runs() -> None:
    throttle = Throttle(start_delay=0.0)
    events: list[str] = []

    async def trace(name: str, info: dict[str, Any]) -> None:
        events.append(name)

    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        request = client.build_request("GET", host.url("/delay/60"), extensions={"trace": trace})
        response = await client.send(request)
    assert response.status_code == 200
    assert "http11.send_request_headers.started" in events
    assert "http11.receive_response_headers.complete" in events
    # Events after the headers (the body, the close) reach it too.
    assert "http11.response_closed.complete" in events
    # The user's request keeps the user's callback.
    assert request.extensions["trace"] is trace
    latency = throttle.slot(host.address).last_latency
    assert latency is not None and latency >= 0.059


async def test_without_a_trace_of_the_callers_httpcore_stops_tracing_once_on_the_wire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each httpcore event costs an awaited call: the throttle's own callback
    # takes the wire turn at the headers and then takes itself off the request.
    seen: list[str] = []
    call = _WireTracer.__call__

    async def spy(self: Any, name: str, info: dict[str, Any]) -> None:
        seen.append(name)
        await call(self, name, info)

    monkeypatch.setattr(_WireTracer, "__call__", spy)
    throttle = fixed(0.2)
    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        for _ in range(3):
            response = await client.get(host.url("/"))
            assert response.status_code == 200
            assert "trace" not in response.request.extensions
    headers_sent = [name for name in seen if name.endswith("send_request_headers.started")]
    assert len(headers_sent) == 3  # the wire turn was taken each time
    assert not any("receive_response" in name or "response_closed" in name for name in seen)
    assert all(gap >= 0.2 - 0.02 for gap in host.gaps()), host.gaps()
    latency = throttle.slot(host.address).last_latency
    assert latency is not None and latency < 5.0


def test_the_wire_tracer_stays_for_a_proxy_tunnels_connect() -> None:
    throttle = Throttle(start_delay=0.0)
    tracer = _WireTracer(Exchange(throttle.acquire_blocking("k"), 0.0), {})
    extensions = {"trace": tracer}  # httpcore's tunnel shares the request's
    connect = SimpleNamespace(method=b"CONNECT", extensions=extensions)
    get = SimpleNamespace(method=b"GET", extensions=extensions)
    asyncio.run(tracer("http11.send_request_headers.started", {"request": connect}))
    assert extensions == {"trace": tracer}  # the tunnel's CONNECT: not yet
    asyncio.run(tracer("http11.send_request_headers.started", {"request": get}))
    assert extensions == {}


# -- per-request control -----------------------------------------------------


@pytest.mark.parametrize(
    ("extensions", "headers"),
    [
        ({}, {"X-AutoThrottle": "no-adjust"}),
        ({}, {"x-autothrottle": "slot=elsewhere"}),
        ({}, {"X-AutoThrottle": "bypass"}),
        ({"autothrottle": {"adjust": False}}, {"X-AutoThrottle": "no-adjust, slot=both"}),
    ],
)
async def test_control_header_never_reaches_the_server(
    extensions: dict[str, Any], headers: dict[str, str]
) -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(2) as (a, b), client_for(throttle, follow_redirects=True) as client:
        response = await client.get(
            a.url("/redirect?to=" + b.url("/landed")), headers=headers, extensions=extensions
        )
    assert response.status_code == 200
    arrivals = a.arrivals + b.arrivals
    assert [x.path for x in arrivals] == ["/redirect", "/landed"]
    for arrival in arrivals:
        assert CONTROL not in {name.lower() for name in arrival.headers}


async def test_bypass_is_neither_delayed_nor_counted() -> None:
    throttle = fixed(600.0)
    async with loopback_hosts(2) as (a, b), client_for(throttle) as client:
        await client.get(a.url("/first"))
        async with asyncio.timeout(20):  # a paced request would wait 600 s
            bypassed = [
                await client.get(a.url("/ext"), extensions={"autothrottle": {"bypass": True}}),
                await client.get(a.url("/hdr"), headers={"X-AutoThrottle": "bypass"}),
                await client.get(b.url("/fresh"), headers={"X-AutoThrottle": "bypass"}),
            ]
    assert [x.path for x in a.arrivals] == ["/first", "/ext", "/hdr"]
    # No ThrottleInfo on them (docs/adapters.md: read it with .get)
    assert all("autothrottle" not in response.extensions for response in bypassed)
    slot = throttle.slot(a.address).snapshot()
    assert (slot.sent, slot.responses, slot.delay) == (1, 1, 600.0)
    assert b.address not in throttle.snapshot()  # a bypassed host gets no slot


async def test_no_adjust_waits_its_turn_but_leaves_the_delay() -> None:
    throttle = Throttle(start_delay=0.4, max_delay=10.0)
    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        await warm_up(client, host)
        await client.get(host.url("/1"), extensions={"autothrottle": {"adjust": False}})
        await client.get(host.url("/2"), headers={"X-AutoThrottle": "no-adjust"})
        slot = throttle.slot(host.address)
        assert (slot.delay, slot.sent, slot.snapshot().responses) == (0.4, 2, 2)
        await client.get(host.url("/3"))
        # A fast 200 halves the delay towards the latency.
        assert slot.delay < 0.3
    assert_spaced(host.arrival_times(), 0.4)  # the no-adjust requests were paced too


async def test_slot_option_chooses_the_slot() -> None:
    throttle = fixed(0.2)
    async with loopback_hosts(2) as (a, b), client_for(throttle) as client:
        await warm_up(client, a, b)
        await asyncio.gather(
            client.get(a.url("/a"), extensions={"autothrottle": {"slot": "shared"}}),
            client.get(b.url("/b"), headers={"X-AutoThrottle": "slot=shared"}),
        )
    snapshot = throttle.snapshot()
    assert set(snapshot) == {"shared"}
    assert snapshot["shared"].sent == 2
    # One slot for both hosts: the second waited for the first's delay.
    (first,) = a.arrival_times()
    (second,) = b.arrival_times()
    assert_spaced(sorted([first, second]), 0.2)


async def test_redirect_hops_are_throttled_on_their_own_hosts() -> None:
    throttle = Throttle(start_delay=0.0, max_delay=600.0)
    async with loopback_hosts(2) as (a, b), client_for(throttle, follow_redirects=True) as client:
        response = await client.get(a.url("/redirect?to=" + b.url("/target")))
        assert response.status_code == 200
        assert [r.status_code for r in response.history] == [302]
        # The second hop waits on b's delay, not a's.
        throttle.slot(a.address).delay = 600.0
        async with asyncio.timeout(20):
            await client.get(b.url("/redirect?to=" + b.url("/again")))
    snap = throttle.snapshot()
    assert (snap[a.address].sent, dict(snap[a.address].status_counts)) == (1, {302: 1})
    assert (snap[b.address].sent, dict(snap[b.address].status_counts)) == (3, {200: 2, 302: 1})
    assert_idle(throttle, a.address)
    assert_idle(throttle, b.address)


async def test_options_apply_to_every_redirect_hop() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(2) as (a, b), client_for(throttle, follow_redirects=True) as client:
        await client.get(
            a.url("/redirect?to=" + b.url("/")), headers={"X-AutoThrottle": "slot=trip"}
        )
    assert set(throttle.snapshot()) == {"trip"}
    assert throttle.slot("trip").sent == 2


# -- in flight until the body is done ----------------------------------------


async def test_streamed_response_holds_the_slot_until_closed() -> None:
    throttle = Throttle(start_delay=0.0, max_delay=0.0)
    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        slot = throttle.slot(host.address)
        async with client.stream("GET", host.url("/stream/4/30")) as response:
            assert slot.in_flight == 1
            async for _ in response.aiter_raw():
                break  # partly read
            assert slot.in_flight == 1
        assert slot.in_flight == 0

        async with client.stream("GET", host.url("/stream/3/10")) as response:
            assert slot.in_flight == 1
            body = await response.aread()
            assert len(body) == 48
            assert slot.in_flight == 0  # fully read: done before the close
    assert slot.snapshot().responses == 2


async def test_open_stream_counts_against_the_cap() -> None:
    throttle = fixed(0.0, max_concurrency=1)
    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        slot = throttle.slot(host.address)
        async with client.stream("GET", host.url("/stream/2/10")) as response:
            second = asyncio.create_task(client.get(host.url("/second")))
            await wait_until(lambda: slot.queued == 1)
            await response.aread()
            await asyncio.wait_for(second, 10)
    assert [a.path for a in host.arrivals] == ["/stream/2/10", "/second"]
    assert_idle(throttle, host.address)


async def test_response_never_closed_is_released_when_collected() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        slot = throttle.slot(host.address)
        request = client.build_request("GET", host.url("/stream/2/10"))
        response = await client.send(request, stream=True)
        assert slot.in_flight == 1
        del response
        gc.collect()
        await wait_until(lambda: slot.in_flight == 0)


async def test_response_never_closed_is_released_after_hold_timeout() -> None:
    throttle = Throttle(start_delay=0.0, hold_timeout=0.3)
    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        slot = throttle.slot(host.address)
        response = await client.send(client.build_request("GET", host.url("/")), stream=True)
        assert slot.in_flight == 1
        await wait_until(lambda: slot.in_flight == 0)
        await response.aclose()
    assert slot.in_flight == 0


# -- cancellation and errors -------------------------------------------------


async def test_cancelled_while_waiting_for_the_throttle() -> None:
    throttle = Throttle(start_delay=600.0, max_delay=600.0)
    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        await client.get(host.url("/first"))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await client.get(host.url("/never"))
        assert_idle(throttle, host.address)
        # No phantom reservation: with the delay gone, the next goes at once.
        throttle.slot(host.address).delay = 0.0
        async with asyncio.timeout(20):
            await client.get(host.url("/next"))
    assert [a.path for a in host.arrivals] == ["/first", "/next"]
    slot = throttle.slot(host.address).snapshot()
    assert (slot.sent, slot.failures) == (2, 0)


async def test_cancelled_while_the_server_is_slow() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), client_for(throttle) as client:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await client.get(host.url("/delay/1000"))
        assert_idle(throttle, host.address)
        # Cancelled while reading a slow body.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.4):
                await client.get(host.url("/stream/50/50"))
        assert_idle(throttle, host.address)
    slot = throttle.slot(host.address).snapshot()
    assert (slot.sent, slot.responses, slot.failures) == (2, 1, 0)


async def test_refused_connection_releases_and_counts_a_failure() -> None:
    throttle = Throttle(start_delay=0.0)
    port = closed_port("127.0.0.2")
    async with client_for(throttle) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.2:{port}/")
    assert_idle(throttle, "127.0.0.2")
    slot = throttle.slot("127.0.0.2").snapshot()
    assert (slot.sent, slot.responses, slot.failures) == (1, 0, 1)


# -- what a request leaves for the garbage collector ---------------------------


@pytest.mark.parametrize("route", ["client", "transport"])
async def test_a_finished_request_leaves_nothing_for_the_garbage_collector(route: str) -> None:
    # A request's exchange, lease and wiring, and its response with everything
    # the response holds, are freed by reference counting once the caller
    # drops them: a cycle would wait for a collection, which in a long crawl
    # walks every live object. Spaced turns: each request waits in the queue
    # and takes its wire turn at the headers (the traced path).
    throttle = fixed(0.02)
    made = AsyncThrottledClient(throttle=throttle) if route == "client" else client_for(throttle)
    async with loopback_hosts(1) as (host,), made as client:
        await client.get(host.url("/warm-up"))  # the connection and its pool, made once
        with left_for_the_collector() as left:
            for _ in range(3):
                assert (await client.get(host.url("/"))).status_code == 200
            async with client.stream("GET", host.url("/stream/3/0")) as response:
                async for _chunk in response.aiter_bytes():
                    pass
            del response
    assert left == []


async def plain_httpx_leaves_a_cycle(refused: str) -> bool:
    """Whether httpx itself, with no throttle, leaves a cycle when ``refused``
    refuses the connection: from Python 3.12 on it does (its ConnectError and the
    frames of its traceback, a plain ``httpx.AsyncClient`` too), and whatever of
    the throttle's is on that traceback waits for the collector with them."""
    async with httpx.AsyncClient() as plain:
        with left_for_the_collector() as left, pytest.raises(httpx.ConnectError):
            await plain.get(refused)
    return bool(left)


async def test_a_failed_cancelled_or_timed_out_request_leaves_nothing_for_the_collector() -> None:
    throttle = fixed(0.2)  # the last request's turn still 0.2 s off, however slow the answer before
    refused = f"http://127.0.0.3:{closed_port('127.0.0.3')}/"
    # Where httpx's own refused connection leaves a cycle, judging it would judge
    # httpx: the request still runs, before the block.
    judged = not await plain_httpx_leaves_a_cycle(refused)
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as client:
        await client.get(host.url("/warm-up"))
        if not judged:
            with pytest.raises(httpx.ConnectError):
                await client.get(refused)
        with left_for_the_collector() as left:
            if judged:
                with pytest.raises(httpx.ConnectError):
                    await client.get(refused)
            waiting = asyncio.ensure_future(client.get(host.url("/")))
            await client.get(host.url("/"))  # meanwhile the other one queues: cancelled
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            del waiting
            with pytest.raises(httpx.PoolTimeout):  # its turn not come within max_wait
                await client.get(host.url("/"), extensions={"autothrottle": {"max_wait": 0.001}})
    assert left == []


def test_the_sync_clients_finished_request_leaves_nothing_for_the_collector() -> None:
    async def serve_then(check: Any) -> None:
        async with loopback_hosts(1) as (host,):
            await asyncio.to_thread(check, host)

    def check(host: LoopbackHost) -> None:
        with ThrottledClient(throttle=fixed(0.02)) as client:
            client.get(host.url("/warm-up"))
            with left_for_the_collector() as left:
                for _ in range(3):
                    assert client.get(host.url("/")).status_code == 200
        assert left == []

    asyncio.run(serve_then(check))


# -- AsyncThrottledClient ---------------------------------------------------------


def assert_paced(host: LoopbackHost, count: int) -> None:
    assert len(host.arrivals) == count
    assert_spaced(host.arrival_times(), 0.2)


async def test_throttled_client_throttles_default_and_mounted_routes() -> None:
    throttle = fixed(0.2)
    async with loopback_hosts(2) as (a, b):
        mounts = {f"http://{b.address}": httpx.AsyncHTTPTransport()}
        async with AsyncThrottledClient(throttle=throttle, mounts=mounts) as client:
            assert client.throttle is throttle
            await warm_up(client, a, b)
            await asyncio.gather(*(client.get(h.url()) for h in (a, b) for _ in range(3)))
    assert_paced(a, 3)
    assert_paced(b, 3)
    assert throttle.slot(b.address).sent == 3


async def test_throttled_client_wraps_a_given_transport_once() -> None:
    throttle = fixed(0.2)
    async with loopback_hosts(1) as (host,):
        async with AsyncThrottledClient(
            throttle=throttle, transport=httpx.AsyncHTTPTransport()
        ) as c:
            await warm_up(c, host)
            await asyncio.gather(*(c.get(host.url()) for _ in range(3)))
        assert_paced(host, 3)
        already = AsyncThrottledTransport(throttle=throttle)
        async with AsyncThrottledClient(throttle=throttle, transport=already) as c:
            await c.get(host.url())  # not throttled twice: it would wait its own turn
    assert throttle.slot(host.address).sent == 4


async def test_throttled_client_keeps_environment_proxies_throttled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    throttle = fixed(0.2)
    async with loopback_hosts(2) as (proxy, target):
        monkeypatch.setenv("HTTP_PROXY", proxy.origin)
        async with AsyncThrottledClient(throttle=throttle) as client:
            await client.get(target.url("/warm-up"), headers={"X-AutoThrottle": "bypass"})
            proxy.forget_arrivals()
            await asyncio.gather(*(client.get(target.url(f"/via/{i}")) for i in range(3)))
    # The proxy got the requests; the slot is the target host's.
    assert target.arrivals == []
    assert sorted(a.path for a in proxy.arrivals) == ["/via/0", "/via/1", "/via/2"]
    assert_paced(proxy, 3)
    assert set(throttle.snapshot()) == {target.address}


# -- debug output ------------------------------------------------------------


async def test_debug_logs_one_record_per_adjusted_response(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="autothrottle")
    throttle = Throttle(start_delay=0.0, max_delay=1.0, debug=True)
    quiet = Throttle(start_delay=0.0, max_delay=1.0)
    async with loopback_hosts(1) as (host,):
        async with client_for(throttle) as client:
            for _ in range(3):
                await client.get(host.url())
            await client.get(host.url(), headers={"X-AutoThrottle": "no-adjust"})
            await client.get(host.url(), headers={"X-AutoThrottle": "bypass"})
        async with client_for(quiet) as client:
            await client.get(host.url())
    records = [r for r in caplog.records if r.name == "autothrottle"]
    assert len(records) == 3
    assert all(host.address in r.getMessage() for r in records)


# -- a pool per host --------------------------------------------------------------------


def pools_of(client: Any) -> Any:
    """The per-origin pools behind a throttled client's default transport."""
    return client._transport.inner.pools


async def test_a_pool_per_host_serves_every_host_and_closes_every_pool() -> None:
    throttle = fixed(0.0)
    async with loopback_hosts(2) as (a, b):
        client = AsyncThrottledClient(throttle=throttle)  # a pool per host by default
        async with client:
            for host in (a, b, a, b):
                response = await client.get(host.url("/"))
                assert response.status_code == 200
            pools = [entry.pool for entry in pools_of(client)._origins.values()]
            # One pool for each origin, each with its own connection, kept alive.
            assert len(pools) == 2
            assert all(len(pool._pool.connections) == 1 for pool in pools)
        assert len(pools_of(client)) == 0
        assert all(pool._pool.connections == [] for pool in pools)
    assert len(a.arrivals) == len(b.arrivals) == 2
    assert_idle(throttle, a.address)


async def test_each_response_carries_its_own_throttle_info() -> None:
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=fixed(0.0)) as client:
        first, second = [await client.get(host.url("/")) for _ in range(2)]
    infos = [response.extensions["autothrottle"] for response in (first, second)]
    assert [info.slot for info in infos] == [host.address] * 2
    assert infos[0] is not infos[1] and infos[0].sent_at <= infos[1].sent_at
    assert first.http_version == "HTTP/1.1"  # httpx's own extensions kept


async def test_a_transports_shared_extensions_are_left_alone() -> None:
    """A transport of your own may hand out one extensions dict to every
    response: each throttled response gets its own copy."""
    shared: dict[str, Any] = {"reason_phrase": b"OK"}

    def answer(request: httpx.Request) -> httpx.Response:
        response = httpx.Response(200)
        response.extensions = shared  # httpx >= 0.28 copies a dict given to Response()
        return response

    inner = httpx.MockTransport(answer)
    transport = AsyncThrottledTransport(inner, throttle=fixed(0.0))
    async with AsyncThrottledClient(throttle=fixed(0.0), transport=transport) as client:
        first, second = [await client.get(f"http://h{i}.test/") for i in range(2)]
    assert shared == {"reason_phrase": b"OK"}
    assert [r.extensions["autothrottle"].slot for r in (first, second)] == ["h0.test", "h1.test"]


async def test_a_pool_per_host_keeps_each_hosts_spacing() -> None:
    throttle = fixed(0.1)
    client = AsyncThrottledClient(throttle=throttle)
    async with loopback_hosts(2) as (a, b), client:
        await asyncio.gather(*(client.get(h.url("/")) for h in (a, b) for _ in range(3)))
    for host in (a, b):
        assert_spaced(host.arrival_times(), 0.1)


async def test_pools_share_one_ssl_context() -> None:
    async with AsyncThrottledClient(throttle=fixed(0.0)) as client:
        pools = pools_of(client)
        made = [pools.take(httpx.URL(f"https://h{i}.example/"), 0.0)[0].pool for i in range(3)]
        contexts = {id(pool._pool._ssl_context) for pool in made}
    assert len(contexts) == 1


async def test_an_idle_hosts_pool_is_closed_after_the_keep_alive_expiry() -> None:
    throttle = fixed(0.0)
    limits = httpx.Limits(keepalive_expiry=0.3)
    async with (
        loopback_hosts(2) as (a, b),
        AsyncThrottledClient(throttle=throttle, limits=limits) as client,
    ):
        pools = pools_of(client)
        await client.get(a.url("/"))
        first = pools._origins[("http", a.address, a.port)].pool
        await asyncio.sleep(0.5)
        await client.get(b.url("/"))  # a's pool has been idle past the expiry
        assert [origin[1] for origin in pools._origins] == [b.address]
        assert first._pool.connections == []  # closed, its connection with it
        await client.get(a.url("/"))  # a new pool, and a new connection
    assert len(a.arrivals) == 2


async def test_a_pool_with_a_body_still_open_is_not_closed() -> None:
    throttle = fixed(0.0)
    limits = httpx.Limits(keepalive_expiry=0.2)
    async with (
        loopback_hosts(2) as (a, b),
        AsyncThrottledClient(throttle=throttle, limits=limits) as client,
    ):
        pools = pools_of(client)
        async with client.stream("GET", a.url("/stream/3/200")) as streaming:
            await asyncio.sleep(0.3)
            await client.get(b.url("/"))  # a's pool is past the expiry, but busy
            assert ("http", a.address, a.port) in pools._origins
            assert len(await streaming.aread()) == 48


def test_a_pool_per_host_with_a_transport_of_your_own_is_refused() -> None:
    with pytest.raises(ValueError, match="pool_per_host"):
        AsyncThrottledClient(
            throttle=Throttle(), pool_per_host=True, transport=httpx.AsyncHTTPTransport()
        )
    with pytest.raises(TypeError, match="pool_per_host"):
        AsyncThrottledClient(throttle=Throttle(), pool_per_host="yes")  # type: ignore[arg-type]


async def test_one_pool_for_all_hosts_when_asked() -> None:
    async with AsyncThrottledClient(throttle=fixed(0.0), pool_per_host=False) as client:
        transport: Any = client._transport
        assert isinstance(transport.inner, httpx.AsyncHTTPTransport)


# -- memory over many hosts -------------------------------------------------------------

ADAPTER_FILES = ("/httpx", "/httpcore", "/autothrottle/", "/anyio/", "/h11/", "/ssl.py")


def _adapter_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes the client side holds: httpx (or httpx2), httpcore, h11, anyio, the library."""
    return sum(
        stat.size
        for stat in snapshot.statistics("filename")
        if any(part in stat.traceback[0].filename for part in ADAPTER_FILES)
    )


#: The thousand-host test's servers, in a process of their own: on the client's
#: loop their work was traced too and took turns with the client's (there, at
#: load 7-10, the test took 23.4-27.5 s with httpx; here 15.6-26.1 s, alternated).
_SERVE_ON = """
import asyncio, json, sys
from aiohttp import web


async def ok(request):
    return web.Response(text="ok")


async def main():
    app = web.Application()
    app.router.add_get("/", ok)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    ports = []
    for address in sys.argv[1:]:
        site = web.TCPSite(runner, address, 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


asyncio.run(main())
"""


@asynccontextmanager
async def servers_on(addresses: list[str]) -> AsyncIterator[list[int]]:
    """One aiohttp.web app answering 200 on each address (a port each), in a
    process of its own that ends when its stdin closes."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SERVE_ON, *addresses, stdin=PIPE, stdout=PIPE
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 120)
        assert line, "the servers' process ended before it listened"
        ports: list[int] = json.loads(line)
        yield ports
    finally:
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()


async def test_a_thousand_hosts_leave_no_pool_and_little_memory_once_forgotten(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Time is moved on by hand past the keep-alive expiry (ten minutes here,
    # so that no pool expires during a crawl slowed by tracing on a loaded
    # machine, where it took over a minute) and the store's idle timeout: the
    # pools' clock and the throttle's are shifted.
    shift = [0.0]

    def later() -> float:
        return time.monotonic() + shift[0]

    monkeypatch.setattr(f"autothrottle._{package}._async.monotonic", later)
    count = 1000
    addresses = [f"127.0.{10 + i // 200}.{1 + i % 200}" for i in range(count)]
    throttle = Throttle(start_delay=0.0, store=MemoryStore(idle_timeout=30.0), clock=later)
    limits = httpx.Limits(keepalive_expiry=600.0)
    # Connections have a minute: the servers' process shares two cores with
    # this one (and a loaded machine's others).
    async with (
        servers_on(addresses) as ports,
        AsyncThrottledClient(throttle=throttle, limits=limits, timeout=60.0) as client,
    ):
        urls = [f"http://{a}:{p}/" for a, p in zip(addresses, ports, strict=True)]
        for url in urls[:5]:  # one-time costs (imports, first connections) before measuring
            await client.get(url)
        pools = pools_of(client)
        tracemalloc.start(1)
        try:
            before = _adapter_bytes(tracemalloc.take_snapshot())
            for start in range(0, count, 50):
                await asyncio.gather(*(client.get(url) for url in urls[start : start + 50]))
            busy = _adapter_bytes(tracemalloc.take_snapshot()) - before
            live = len(pools)
            shift[0] = 1200.0  # every host idle past the keep-alive expiry and the idle timeout
            throttle.evict_idle()  # the slots are forgotten
            for _ in range(count // pools.SWEEP + 5):
                await client.get(urls[0])  # each request closes a few idle pools
            gc.collect()  # garbage is not kept: count what is still reachable
            after = _adapter_bytes(tracemalloc.take_snapshot()) - before
        finally:
            tracemalloc.stop()
        remaining_pools = len(pools)
    assert live >= count  # a pool per host while the hosts were in use
    assert busy / count < 50_000, busy  # bytes per host while its pool lives
    assert remaining_pools <= 1 and len(list(throttle.slots())) <= 1
    assert after / count < 1_000, after  # bytes per host once forgotten
