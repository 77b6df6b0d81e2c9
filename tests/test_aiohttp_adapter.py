"""The aiohttp adapter against real aiohttp.web servers on loopback addresses.

Every test talks to real servers from :mod:`loopback` (127.0.0.2, 127.0.0.3 …,
distinct hosts to the throttle) and asserts what the *server* saw where it
can: arrival times, headers, requests in service at once.

aioresponses is deliberately not used: it patches ``ClientSession._request``
and so bypasses aiohttp's client middlewares, which means requests mocked
with it are never throttled (see autothrottle.aiohttp's module docs).

Real-time bounds are generous (the machine is shared); no test asserts speed.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import socket
import weakref
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp import ClientHandlerType, ClientRequest, ClientResponse

from autothrottle import Throttle
from autothrottle._aiohttp_parts import (
    OPTIONS_SET,
    hold_until_finished,
    hook_connector,
    hook_request_options,
)
from autothrottle._exchange import paced
from autothrottle.aiohttp import (
    _PLUG,
    ThrottledSession,
    _ThrottleMiddleware,
    throttle_info,
    throttle_middleware,
    throttle_trace_config,
)
from helpers import FakeClock, SpyPolicy, fixed, wait_until
from loopback import LoopbackHost, loopback_hosts


def key(host: LoopbackHost) -> str:
    return host.address


async def fetch(session: aiohttp.ClientSession, url: str, **kwargs: Any) -> int:
    async with session.get(url, **kwargs) as response:
        await response.read()
        return response.status


async def warm_up(session: aiohttp.ClientSession, host: LoopbackHost) -> None:
    """Open a pooled connection to ``host`` without touching its slot, then forget it.

    Arrival gaps at the server then measure the throttle, not the extra time
    the first request of a test spends connecting.
    """
    await fetch(session, host.url("/warm-up"), headers={"X-AutoThrottle": "bypass"})
    host.forget_arrivals()


# Arrival gaps are measured at the server, after the client's and the server's
# own scheduling, so they carry a few ms of noise on a busy machine.
TOLERANCE = 0.02


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
    return port


# -- pacing ---------------------------------------------------------------------------


async def test_arrivals_at_the_server_are_spaced_by_the_delay() -> None:
    policy = SpyPolicy()
    throttle = fixed(0.2, policy=policy)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        await warm_up(session, host)
        statuses = await asyncio.gather(*(fetch(session, host.url(f"/{i}")) for i in range(5)))
    assert statuses == [200] * 5
    assert len(host.arrivals) == 5
    assert all(gap >= 0.2 - TOLERANCE for gap in host.gaps()), host.gaps()
    # The queued requests waited 0.2 .. 1.0 s in the throttle; none of that is
    # latency. Counted, three of the five would be 0.6 s or more; the median
    # leaves room for a stalled process (one answer read 1.6 s late at load 18).
    assert len(policy.latencies) == 5
    assert sorted(policy.latencies)[2] < 0.15, policy.latencies
    slot = throttle.slot(key(host))
    assert (slot.sent, slot.snapshot().responses, slot.in_flight, slot.queued) == (5, 5, 0, 0)


async def test_the_cap_is_never_exceeded() -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=2)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        await asyncio.gather(*(fetch(session, host.url("/delay/50")) for _ in range(10)))
    assert len(host.arrivals) == 10
    assert host.max_in_service == 2
    assert throttle.slot(key(host)).in_flight == 0


async def test_latency_excludes_pool_waiting() -> None:
    # One connection for five concurrent requests: the last waits ~0.8 s in the
    # connector's pool, but its latency is still about the server's 0.2 s.
    policy = SpyPolicy()
    throttle = Throttle(start_delay=0.0, max_concurrency=8, policy=policy)
    connector = aiohttp.TCPConnector(limit=1)
    async with (
        loopback_hosts(1) as (host,),
        ThrottledSession(throttle=throttle, connector=connector) as session,
    ):
        await asyncio.gather(*(fetch(session, host.url("/delay/200")) for _ in range(5)))
    assert host.max_in_service == 1
    assert len(policy.latencies) == 5
    assert all(0.19 <= latency < 0.6 for latency in policy.latencies), policy.latencies
    last = throttle.slot(key(host)).last_latency
    assert last is not None and 0.19 <= last < 0.6


async def test_with_the_trace_config_latency_excludes_pool_waiting_too() -> None:
    # A session built by hand: its connector is not hooked, so the trace
    # config's connection signals find the exchange and start the latency clock.
    policy = SpyPolicy()
    throttle = Throttle(start_delay=0.0, max_concurrency=8, policy=policy)
    async with (
        loopback_hosts(1) as (host,),
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1),
            middlewares=(throttle_middleware(throttle),),
            trace_configs=[throttle_trace_config()],
        ) as session,
    ):
        await asyncio.gather(*(fetch(session, host.url("/delay/200")) for _ in range(5)))
    assert host.max_in_service == 1
    assert len(policy.latencies) == 5
    assert all(0.19 <= latency < 0.6 for latency in policy.latencies), policy.latencies


async def test_without_the_trace_config_latency_falls_back_to_the_middleware_time() -> None:
    policy = SpyPolicy()
    throttle = Throttle(start_delay=0.0, policy=policy)
    async with (
        loopback_hosts(1) as (host,),
        aiohttp.ClientSession(middlewares=(throttle_middleware(throttle),)) as session,
    ):
        assert await fetch(session, host.url("/delay/100")) == 200
        # The header still works without the trace config, and is still stripped.
        await fetch(session, host.url("/"), headers={"X-AutoThrottle": "slot=manual"})
    assert len(policy.latencies) == 2
    assert policy.latencies[0] >= 0.09
    assert throttle.slot("manual").sent == 1
    assert all("x-autothrottle" not in {h.lower() for h in a.headers} for a in host.arrivals)


async def test_hosts_never_wait_for_each_other() -> None:
    # One connection in the pool: a request waiting in the throttle must not hold it.
    throttle = Throttle(start_delay=0.0, max_delay=60.0)
    connector = aiohttp.TCPConnector(limit=1)
    async with (
        loopback_hosts(2) as (slow, fast),
        ThrottledSession(throttle=throttle, connector=connector) as session,
    ):
        await fetch(session, slow.url("/"))
        throttle.slot(key(slow)).delay = 30.0
        waiting = asyncio.create_task(fetch(session, slow.url("/second")))
        await wait_until(lambda: throttle.slot(key(slow)).queued == 1)
        statuses = await asyncio.wait_for(
            asyncio.gather(*(fetch(session, fast.url(f"/{i}")) for i in range(4))), 10
        )
        assert statuses == [200] * 4
        assert not waiting.done()
        assert throttle.slot(key(slow)).queued == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    assert len(fast.arrivals) == 4
    assert [a.path for a in slow.arrivals] == ["/"]
    slot = throttle.slot(key(slow))
    assert (slot.in_flight, slot.queued) == (0, 0)


# -- per-request options ---------------------------------------------------------------

VIA_CTX = "trace_request_ctx"
VIA_HEADER = "header"


def options(via: str, ctx: dict[str, Any], header: str) -> dict[str, Any]:
    if via == VIA_CTX:
        return {"trace_request_ctx": {"autothrottle": ctx}}
    return {"headers": {"X-AutoThrottle": header}}


@pytest.mark.parametrize("via", [VIA_CTX, VIA_HEADER])
async def test_bypass_is_neither_delayed_nor_counted(via: str) -> None:
    throttle = Throttle(start_delay=30.0, max_delay=60.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        await fetch(session, host.url("/"))  # the first goes at once; the next would wait 30 s
        bypass = options(via, {"bypass": True}, "bypass")
        statuses = await asyncio.wait_for(
            asyncio.gather(*(fetch(session, host.url("/b"), **bypass) for _ in range(3))), 10
        )
    assert statuses == [200] * 3
    slot = throttle.slot(key(host))
    assert (slot.sent, slot.snapshot().responses, slot.in_flight) == (1, 1, 0)
    assert len(host.arrivals) == 4
    assert all("x-autothrottle" not in {h.lower() for h in a.headers} for a in host.arrivals)


@pytest.mark.parametrize("name", ["x-autothrottle", "X-AUTOTHROTTLE", "X-AutoThrottle"])
async def test_the_control_header_is_read_and_stripped_in_any_case(name: str) -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        assert await fetch(session, host.url("/"), headers={name: "slot=manual"}) == 200
    assert throttle.slot("manual").sent == 1
    assert throttle.slot(key(host)).sent == 0
    assert all("x-autothrottle" not in {h.lower() for h in a.headers} for a in host.arrivals)


@pytest.mark.parametrize("via", [VIA_CTX, VIA_HEADER])
async def test_no_adjust_waits_but_keeps_the_delay(via: str) -> None:
    throttle = Throttle(start_delay=0.3, max_delay=60.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        await warm_up(session, host)
        no_adjust = options(via, {"adjust": False}, "no-adjust")
        await asyncio.gather(*(fetch(session, host.url("/"), **no_adjust) for _ in range(2)))
        slot = throttle.slot(key(host))
        assert slot.delay == 0.3  # a 1 ms response would have halved it
        assert (slot.sent, slot.snapshot().responses) == (2, 2)
        assert host.gaps()[0] >= 0.3 - TOLERANCE  # ... but it waited its turn
        await fetch(session, host.url("/"))
        assert slot.delay < 0.3  # an ordinary response does adjust
    assert all("x-autothrottle" not in {h.lower() for h in a.headers} for a in host.arrivals)


@pytest.mark.parametrize("via", [VIA_CTX, VIA_HEADER])
async def test_slot_option_uses_the_named_slot(via: str) -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        await fetch(session, host.url("/"), **options(via, {"slot": "api"}, "slot=api"))
        # The option belongs to that request only: the next one uses the host's slot.
        await fetch(session, host.url("/"))
    assert throttle.slot("api").sent == 1
    assert throttle.slot(key(host)).sent == 1
    assert all("x-autothrottle" not in {h.lower() for h in a.headers} for a in host.arrivals)


async def test_a_key_function_chooses_the_slot() -> None:
    seen: list[str] = []

    def one_slot(url: str) -> str:
        seen.append(url)
        return "everything"

    throttle = Throttle(start_delay=0.0, key=one_slot)
    async with loopback_hosts(2) as (a, b), ThrottledSession(throttle=throttle) as session:
        await fetch(session, a.url("/x?q=1"))
        await fetch(session, b.url("/y"))
    assert seen == [a.url("/x?q=1"), b.url("/y")]
    assert throttle.snapshot().keys() == {"everything"}
    assert throttle.slot("everything").sent == 2


@pytest.mark.parametrize("hooks", ["session", "trace config"])
async def test_the_first_options_a_process_passes_are_read(hooks: str) -> None:
    """Until a request carries ``trace_request_ctx`` options, the middleware and
    the session's methods do not look for them (``OPTIONS_SET``): the first one
    that does is read, through the session's methods or the trace config."""
    throttle = Throttle(start_delay=0.0)
    session = (
        ThrottledSession(throttle=throttle)
        if hooks == "session"
        else aiohttp.ClientSession(
            middlewares=(throttle_middleware(throttle),), trace_configs=[throttle_trace_config()]
        )
    )
    before, OPTIONS_SET[0] = OPTIONS_SET[0], False  # as in a process that passed none yet
    try:
        async with loopback_hosts(1) as (host,), session:
            await fetch(session, host.url("/"))
            ctx = {"autothrottle": {"slot": "api"}}
            await fetch(session, host.url("/"), trace_request_ctx=ctx)
            await fetch(session, host.url("/"))
    finally:
        OPTIONS_SET[0] = before or OPTIONS_SET[0]
    assert throttle.slot("api").sent == 1
    assert throttle.slot(key(host)).sent == 2


async def test_header_and_trace_ctx_options_merge() -> None:
    throttle = Throttle(start_delay=0.5, max_delay=60.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        await fetch(
            session,
            host.url("/"),
            trace_request_ctx={"autothrottle": {"slot": "merged"}},
            headers={"X-AutoThrottle": "no-adjust"},
        )
    slot = throttle.slot("merged")
    assert (slot.sent, slot.delay) == (1, 0.5)
    assert throttle.snapshot().keys() == {"merged"}


async def test_malformed_options_fail_loudly_and_leave_nothing_behind() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        with pytest.raises(ValueError, match="bogus"):
            await session.get(host.url("/"), trace_request_ctx={"autothrottle": {"bogus": 1}})
        with pytest.raises(ValueError, match="nope"):
            await session.get(host.url("/"), headers={"X-AutoThrottle": "nope"})
        # The failed request's options do not leak into the next one.
        assert await fetch(session, host.url("/")) == 200
    assert len(host.arrivals) == 1
    assert throttle.slot(key(host)).in_flight == 0


# -- redirects and the lifetime of a response ----------------------------------------


async def test_redirect_hops_are_throttled_on_their_own_hosts() -> None:
    throttle = Throttle(start_delay=0.0)
    async with (
        loopback_hosts(2) as (a, b),
        ThrottledSession(throttle=throttle) as session,
        session.get(a.url(f"/redirect?to={b.url('/target')}")) as response,
    ):
        assert response.status == 200
        assert len(response.history) == 1
        # The redirect's response was released when aiohttp followed it.
        assert throttle.slot(key(a)).in_flight == 0
        await response.read()
    for host, path in ((a, "/redirect"), (b, "/target")):
        slot = throttle.slot(key(host))
        assert (slot.sent, slot.snapshot().responses, slot.in_flight) == (1, 1, 0)
        assert [arrival.path for arrival in host.arrivals] == [path]
    assert throttle.slot(key(a)).snapshot().status_counts == {302: 1}


async def test_each_redirect_hop_waits_for_its_own_slot() -> None:
    throttle = Throttle(start_delay=30.0, max_delay=60.0)
    async with loopback_hosts(2) as (a, b), ThrottledSession(throttle=throttle) as session:
        await fetch(session, b.url("/"))  # b's next request must now wait 30 s
        task = asyncio.create_task(fetch(session, a.url(f"/redirect?to={b.url('/target')}")))
        await wait_until(lambda: throttle.slot(key(b)).queued == 1)
        assert [arrival.path for arrival in a.arrivals] == ["/redirect"]
        assert throttle.slot(key(a)).in_flight == 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert [arrival.path for arrival in b.arrivals] == ["/"]
    for host in (a, b):
        slot = throttle.slot(key(host))
        assert (slot.in_flight, slot.queued) == (0, 0)


async def test_a_streamed_body_holds_the_slot_until_read() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        slot = throttle.slot(key(host))
        async with session.get(host.url("/stream/4/100")) as response:
            assert slot.in_flight == 1
            body = await response.read()
            assert slot.in_flight == 0
        assert body == b"x" * 64

        response = await session.get(host.url("/stream/4/100"))
        assert slot.in_flight == 1
        chunks = [chunk async for chunk in response.content.iter_any()]
        assert b"".join(chunks) == b"x" * 64
        assert slot.in_flight == 0
        response.release()


@pytest.mark.parametrize("finish", ["close", "release", "context"])
async def test_closing_an_unread_streamed_response_frees_the_slot(finish: str) -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        slot = throttle.slot(key(host))
        if finish == "context":
            async with session.get(host.url("/stream/20/100")):
                assert slot.in_flight == 1
        else:
            response = await session.get(host.url("/stream/20/100"))
            assert slot.in_flight == 1
            getattr(response, finish)()
        assert slot.in_flight == 0


async def test_an_unread_response_is_released_once_its_body_has_arrived() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        response = await session.get(host.url("/stream/3/50"))
        slot = throttle.slot(key(host))
        assert slot.in_flight == 1
        await wait_until(lambda: slot.in_flight == 0)
        assert response.status == 200  # never read, never closed


@pytest.mark.skipif(
    not hasattr(aiohttp.client_proto.ResponseHandler, "closed"),
    reason="this aiohttp (3.12.0) has no ResponseHandler.closed: a lost connection "
    "releases when the response is read, closed or collected",
)
async def test_an_unread_response_is_released_when_its_connection_is_lost() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,):
        session = ThrottledSession(throttle=throttle)
        response = await session.get(host.url("/stream/50/100"))
        slot = throttle.slot(key(host))
        assert slot.in_flight == 1
        await session.close()  # the crawl gives up with the response still open
        await wait_until(lambda: slot.in_flight == 0)
        assert response.status == 200  # still referenced, never closed


@pytest.mark.skipif(
    not hasattr(aiohttp.client_proto.ResponseHandler, "closed"),
    reason="this aiohttp (3.12.0) has no ResponseHandler.closed",
)
async def test_a_pooled_connection_lost_releases_the_response_reading_from_it_now() -> None:
    # One callback on the connection's closed future serves every response it
    # carries, one after another: the one reading when it is lost is released,
    # and the callbacks do not pile up with the responses.
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,):
        session = ThrottledSession(throttle=throttle)
        slot = throttle.slot(key(host))
        protocols = set()
        for _ in range(5):
            # 300 ms of body: aiohttp lets the connection go once the body is in,
            # read or not, and a loaded machine came to the check after 3 ms of it.
            async with session.get(host.url("/stream/3/100")) as response:
                assert response.connection is not None
                protocols.add(response.connection.protocol)
                assert slot.in_flight == 1
                await response.read()
        assert slot.in_flight == 0
        response = await session.get(host.url("/stream/50/100"))
        assert response.connection is not None
        protocol = response.connection.protocol
        assert protocols == {protocol}  # the same connection all along
        assert protocol is not None and protocol.closed is not None
        assert len(protocol.closed._callbacks or ()) <= 2
        assert slot.in_flight == 1
        await session.close()
        await wait_until(lambda: slot.in_flight == 0)
        assert response.status == 200  # still referenced, never closed


async def test_a_dropped_unread_response_is_released_and_the_next_request_goes() -> None:
    # aiohttp's body stream refers to its response, and a large unread body
    # keeps the connection (and so the stream) alive: without care the slot
    # would stay held until hold_timeout. With a cap of 1 the next request
    # would wait that long.
    throttle = Throttle(start_delay=0.0, max_concurrency=1, hold_timeout=600.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        response = await session.get(host.url("/stream/50/100"))
        slot = throttle.slot(key(host))
        assert slot.in_flight == 1
        collected = weakref.ref(response)
        del response
        gc.collect()
        await wait_until(lambda: slot.in_flight == 0)
        assert collected() is None
        async with asyncio.timeout(60):  # far below hold_timeout
            async with session.get(host.url("/")) as second:
                assert second.status == 200
        assert len(host.arrivals) == 2


class _FakeConnection:
    def __init__(self, closed: asyncio.Future[None]) -> None:
        self.protocol = SimpleNamespace(closed=closed)
        self.callbacks: list[Callable[[], None]] = []

    def add_callback(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)


class _FakeResponse:
    status = 200

    def __init__(self, connection: _FakeConnection) -> None:
        self.connection = connection


@pytest.mark.parametrize("cycle", [False, True])
async def test_the_finalizer_backstop_releases_a_collected_response(cycle: bool) -> None:
    # A response that is collected while its connection lives on (not reachable
    # with aiohttp's own classes, which the connection keeps alive; this is the
    # last line before hold_timeout). In a reference cycle the release runs
    # from garbage collection, so it is deferred to the loop.
    throttle = Throttle(start_delay=0.0)
    lease = await throttle.acquire("fake")
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    connection = _FakeConnection(closed)
    response = _FakeResponse(connection)
    hold_until_finished(response, lease)  # type: ignore[arg-type]
    if cycle:
        response.__dict__["cycle"] = response
    del response
    gc.collect()
    await wait_until(lambda: throttle.slot("fake").in_flight == 0)
    assert lease.released
    # The connection's own release later is harmless.
    connection.callbacks[0]()
    assert throttle.slot("fake").in_flight == 0
    assert not closed.done()


async def test_hold_timeout_bounds_a_response_that_is_never_finished() -> None:
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, hold_timeout=5.0, clock=clock)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        response = await session.get(host.url("/stream/50/100"))
        slot = throttle.slot(key(host))
        assert slot.in_flight == 1
        clock.advance(5.0)
        assert slot.in_flight == 0
        response.close()


async def test_head_and_empty_responses_do_not_hold_the_slot() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        response = await session.head(host.url("/"))
        assert throttle.slot(key(host)).in_flight == 0
        response.release()
        response = await session.get(host.url("/status/204"))
        assert response.status == 204
        assert throttle.slot(key(host)).in_flight == 0
        response.release()


# -- the user's own middlewares and trace configs --------------------------------------


async def test_user_middleware_retries_are_each_throttled() -> None:
    calls: list[str] = []

    async def retry_once(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        calls.append(str(request.url))
        response = await handler(request)
        if response.status == 503:
            response.release()
            response = await handler(request)
        return response

    throttle = fixed(0.2)
    async with (
        loopback_hosts(1) as (host,),
        ThrottledSession(throttle=throttle, middlewares=(retry_once,)) as session,
    ):
        await warm_up(session, host)
        calls.clear()
        assert (
            await fetch(
                session, host.url("/status/503"), headers={"X-AutoThrottle": "slot=retried"}
            )
            == 503
        )
    assert len(calls) == 1
    assert len(host.arrivals) == 2
    assert host.gaps()[0] >= 0.2 - TOLERANCE  # the retry waited its turn
    slot = throttle.slot("retried")  # the header's option held for the retry too
    assert (slot.sent, slot.snapshot().responses, slot.in_flight) == (2, 2, 0)
    assert slot.snapshot().status_counts == {503: 2}
    assert all("x-autothrottle" not in {h.lower() for h in a.headers} for a in host.arrivals)


async def test_user_trace_configs_still_run() -> None:
    seen: list[str] = []

    async def on_start(s: aiohttp.ClientSession, ctx: SimpleNamespace, params: Any) -> None:
        seen.append(f"start {ctx.trace_request_ctx['mine']}")

    async def on_connection(s: aiohttp.ClientSession, ctx: SimpleNamespace, params: Any) -> None:
        seen.append("connection")

    async def on_end(s: aiohttp.ClientSession, ctx: SimpleNamespace, params: Any) -> None:
        seen.append(f"end {params.response.status}")

    mine = aiohttp.TraceConfig()
    mine.on_request_start.append(on_start)
    mine.on_connection_create_end.append(on_connection)
    mine.on_request_end.append(on_end)
    throttle = Throttle(start_delay=0.0)
    async with (
        loopback_hosts(1) as (host,),
        ThrottledSession(throttle=throttle, trace_configs=[mine]) as session,
    ):
        ctx = {"mine": 1, "autothrottle": {"slot": "traced"}}
        assert await fetch(session, host.url("/"), trace_request_ctx=ctx) == 200
        # Ours are read without a TraceConfig of the throttle's: the user's is the only one.
        assert session.trace_configs == [mine]
    assert seen == ["start 1", "connection", "end 200"]
    assert throttle.slot("traced").sent == 1


_REQUEST_METHODS = ["get", "options", "head", "post", "put", "patch", "delete", "request"]


@pytest.mark.parametrize("name", _REQUEST_METHODS)
async def test_every_request_method_reads_the_options_and_is_throttled(name: str) -> None:
    """ThrottledSession gives the session request methods of its own, which
    call aiohttp's ``_request`` directly: each reads ``trace_request_ctx``
    options, and each request without them goes through the throttle too."""
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        call = getattr(session, name)
        first: tuple[str, ...] = ("PUT",) if name == "request" else ()
        ctx = {"autothrottle": {"slot": "api"}}
        async with call(*first, host.url("/a"), trace_request_ctx=ctx) as response:
            await response.read()
        async with call(*first, host.url("/b")) as response:
            await response.read()
    assert throttle.slot("api").sent == 1
    assert throttle.slot(key(host)).sent == 1
    assert [a.path for a in host.arrivals] == ["/a", "/b"]


async def test_the_request_methods_take_aiohttps_arguments_and_defaults() -> None:
    """Each method a ThrottledSession has in place of aiohttp's passes
    ``_request`` what aiohttp's would: the same parameters, the same
    defaults (``head`` does not follow redirects, ``get`` does)."""
    async with ThrottledSession(throttle=Throttle()) as session:
        for name in _REQUEST_METHODS:
            ours = inspect.signature(getattr(session, name)).parameters
            theirs = inspect.signature(getattr(aiohttp.ClientSession, name)).parameters
            assert [(p.name, p.kind, p.default) for p in ours.values()] == [
                (p.name, p.kind, p.default) for p in theirs.values() if p.name != "self"
            ], name


async def test_a_redirect_is_followed_as_aiohttps_methods_would() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        target = host.url("/end")
        contexts: list[dict[str, Any] | None] = [None, {"autothrottle": {}}]
        for ctx in contexts:
            async with session.get(host.url(f"/redirect?to={target}"), trace_request_ctx=ctx) as r:
                assert (r.status, len(r.history)) == (200, 1)
        for ctx in (None, {"autothrottle": {}}):
            async with session.head(host.url(f"/redirect?to={target}"), trace_request_ctx=ctx) as r:
                assert (r.status, len(r.history)) == (302, 0)


class _Cached(ClientResponse):
    """Stands for a cache's response class (aiohttp-client-cache's says ``from_cache``)."""

    from_cache = True


class _Fresh(ClientResponse):
    from_cache = False


@pytest.mark.parametrize(
    ("response_class", "hits"), [(ClientResponse, 0), (_Fresh, 0), (_Cached, 1)]
)
async def test_a_response_class_that_says_from_cache_is_a_cache_hit(
    response_class: type[ClientResponse], hits: int
) -> None:
    """aiohttp's own response is read on a shorter way than any other class;
    both observe the response, and only the other looks for ``from_cache``."""
    throttle = Throttle(start_delay=0.0)
    async with (
        loopback_hosts(1) as (host,),
        ThrottledSession(throttle=throttle, response_class=response_class) as session,
    ):
        assert await fetch(session, host.url("/")) == 200
    snapshot = throttle.slot(key(host)).snapshot()
    assert (snapshot.responses, snapshot.cache_hits, snapshot.in_flight) == (1, hits, 0)


async def test_a_middleware_making_its_own_request_keeps_the_outer_options() -> None:
    async def fetch_token(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        if request.url.path == "/api":
            # A side request from inside the middleware, with options of its own.
            await fetch(session, side.url("/token"), trace_request_ctx={"autothrottle": {}})
        return await handler(request)

    throttle = Throttle(start_delay=0.0)
    async with (
        loopback_hosts(2) as (api, side),
        ThrottledSession(throttle=throttle, middlewares=(fetch_token,)) as session,
    ):
        await fetch(session, api.url("/api"), trace_request_ctx={"autothrottle": {"slot": "api"}})
    assert throttle.slot("api").sent == 1
    assert throttle.slot(key(side)).sent == 1
    assert key(api) not in throttle.snapshot()


async def test_a_side_request_without_options_does_not_take_the_outer_ones() -> None:
    # The session hands trace_request_ctx options to the middleware through
    # the task's context; a request made from inside another must not see the
    # outer request's, though it passes none of its own.
    async def fetch_token(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        if request.url.path == "/api":
            await fetch(session, side.url("/token"))
        return await handler(request)

    throttle = Throttle(start_delay=0.0)
    async with (
        loopback_hosts(2) as (api, side),
        ThrottledSession(throttle=throttle, middlewares=(fetch_token,)) as session,
    ):
        await fetch(session, api.url("/api"), trace_request_ctx={"autothrottle": {"slot": "api"}})
        await fetch(session, side.url("/after"))  # and nothing lingers after it
    assert throttle.slot("api").sent == 1
    assert throttle.slot(key(side)).sent == 2


async def test_per_request_middlewares_replace_the_session_ones() -> None:
    throttle = Throttle(start_delay=30.0, max_delay=60.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        await fetch(session, host.url("/"))
        # aiohttp runs only these middlewares: the throttle is off for this request ...
        await asyncio.wait_for(fetch(session, host.url("/off"), middlewares=()), 10)
        # ... unless one is put back.
        task = asyncio.create_task(
            fetch(session, host.url("/on"), middlewares=(throttle_middleware(throttle),))
        )
        await wait_until(lambda: throttle.slot(key(host)).queued == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert [a.path for a in host.arrivals] == ["/", "/off"]


async def test_session_built_by_hand() -> None:
    throttle = fixed(0.2)
    async with (
        loopback_hosts(1) as (host,),
        aiohttp.ClientSession(
            middlewares=(throttle_middleware(throttle),),
            trace_configs=[throttle_trace_config()],
        ) as session,
    ):
        await warm_up(session, host)
        await asyncio.gather(
            *(
                fetch(session, host.url("/"), trace_request_ctx={"autothrottle": {"slot": "h"}})
                for _ in range(3)
            )
        )
    assert all(gap >= 0.2 - TOLERANCE for gap in host.gaps()), host.gaps()
    assert throttle.slot("h").sent == 3


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="throttle"):
        throttle_middleware("not a throttle")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="throttle"):
        ThrottledSession(throttle=None)  # type: ignore[arg-type]
    throttle = Throttle()
    with pytest.raises(ValueError, match="middlewares"):
        ThrottledSession(throttle=throttle, middlewares=(throttle_middleware(throttle),))


# -- cancellation and errors -------------------------------------------------------------


async def test_cancel_while_waiting_in_the_throttle() -> None:
    throttle = Throttle(start_delay=30.0, max_delay=60.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        await fetch(session, host.url("/"))
        tasks = [asyncio.create_task(fetch(session, host.url("/never"))) for _ in range(3)]
        slot = throttle.slot(key(host))
        await wait_until(lambda: slot.queued == 3)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert (slot.in_flight, slot.queued, slot.snapshot().failures) == (0, 0, 0)
    assert [a.path for a in host.arrivals] == ["/"]


async def test_cancel_while_the_server_is_slow() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        task = asyncio.create_task(fetch(session, host.url("/delay/1000")))
        await wait_until(lambda: host.in_service == 1)
        slot = throttle.slot(key(host))
        assert slot.in_flight == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (slot.in_flight, slot.queued, slot.snapshot().failures) == (0, 0, 0)


async def test_timeout_releases_the_slot() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        with pytest.raises(asyncio.TimeoutError):
            await fetch(session, host.url("/delay/1000"), timeout=aiohttp.ClientTimeout(total=0.2))
        slot = throttle.slot(key(host))
        # aiohttp turns its own timeout into TimeoutError where it reads the
        # headers, so the middleware sees an error: a failure, not a cancellation.
        assert (slot.in_flight, slot.queued, slot.snapshot().failures) == (0, 0, 1)
        with pytest.raises(asyncio.TimeoutError):
            await fetch(
                session, host.url("/delay/1000"), timeout=aiohttp.ClientTimeout(sock_read=0.2)
            )
        assert (slot.in_flight, slot.queued, slot.snapshot().failures) == (0, 0, 2)


async def test_refused_connection_releases_and_counts_a_failure() -> None:
    throttle = Throttle(start_delay=0.0)
    port = free_port("127.0.0.2")
    async with ThrottledSession(throttle=throttle) as session:
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.get(f"http://127.0.0.2:{port}/")
    slot = throttle.slot("127.0.0.2")
    assert (slot.sent, slot.snapshot().failures, slot.snapshot().responses, slot.in_flight) == (
        1,
        1,
        0,
        0,
    )


async def test_dropped_connection_releases_and_counts_a_failure() -> None:
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await session.get(host.url("/close"))
    slot = throttle.slot(key(host))
    assert slot.snapshot().failures >= 1
    assert (slot.snapshot().responses, slot.in_flight, slot.queued) == (0, 0, 0)


# -- debug output ------------------------------------------------------------------------


async def test_debug_logs_one_record_per_adjusted_response(
    caplog: pytest.LogCaptureFixture,
) -> None:
    throttle = Throttle(start_delay=0.0, debug=True)
    caplog.set_level(logging.DEBUG, logger="autothrottle")
    async with loopback_hosts(2) as (a, b), ThrottledSession(throttle=throttle) as session:
        await fetch(session, a.url("/"))
        await fetch(session, b.url("/status/404"))
        await fetch(session, a.url("/"), headers={"X-AutoThrottle": "no-adjust"})
        await fetch(session, a.url("/"), headers={"X-AutoThrottle": "bypass"})
    records = [r for r in caplog.records if r.name == "autothrottle"]
    assert len(records) == 2
    assert f"slot={a.address}" in records[0].getMessage()
    assert "status=404" in records[1].getMessage()


async def test_without_debug_nothing_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    throttle = Throttle(start_delay=0.0)
    caplog.set_level(logging.DEBUG, logger="autothrottle")
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        await fetch(session, host.url("/"))
    assert not [r for r in caplog.records if r.name == "autothrottle"]


async def test_isinstance_tells_a_throttled_session() -> None:
    throttle = Throttle()
    async with ThrottledSession(throttle=throttle) as session:
        assert isinstance(session, ThrottledSession)
        assert type(session) is aiohttp.ClientSession  # aiohttp forbids subclasses
    by_hand = aiohttp.ClientSession(middlewares=(throttle_middleware(throttle),))
    async with by_hand, aiohttp.ClientSession() as plain:
        assert isinstance(by_hand, ThrottledSession)
        assert not isinstance(plain, ThrottledSession)
    assert not isinstance("a session", ThrottledSession)


async def test_a_patch_of_request_made_before_the_session_is_what_it_calls() -> None:
    """The session's request methods call the ``_request`` it had when it was
    made: a mock of ``ClientSession._request`` patched before is seen."""
    calls: list[tuple[str, str]] = []

    async def fake(self: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> Any:
        calls.append((method, url))
        raise RuntimeError("mocked")

    with mock.patch.object(aiohttp.ClientSession, "_request", fake):
        async with ThrottledSession(throttle=Throttle()) as session:
            for call in (session.get, session.post):
                with pytest.raises(RuntimeError, match="mocked"):
                    await call("http://127.0.0.2/")
    assert calls == [("GET", "http://127.0.0.2/"), ("POST", "http://127.0.0.2/")]


async def test_a_websocket_handshake_goes_through_the_session_and_is_released() -> None:
    """``ws_connect`` sends its handshake through the session's ``request``
    (the session's own method): it is paced on the host's slot, and the
    upgraded connection does not hold the slot."""
    from aiohttp import web

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            await ws.send_str(message.data)
        return ws

    app = web.Application()
    app.router.add_get("/ws", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    throttle = Throttle(start_delay=0.0)
    try:
        async with (
            ThrottledSession(throttle=throttle) as session,
            session.ws_connect(f"http://127.0.0.1:{port}/ws") as ws,
        ):
            await ws.send_str("hello")
            assert (await ws.receive_str()) == "hello"
            assert throttle.slot("127.0.0.1").in_flight == 0
    finally:
        await runner.cleanup()
    snapshot = throttle.slot("127.0.0.1").snapshot()
    assert (snapshot.sent, snapshot.responses, snapshot.in_flight) == (1, 1, 0)


# -- the middleware is the skeleton with aiohttp's steps written in ------------------


def _skeleton_middleware(throttle: Throttle) -> Callable[..., Any]:
    """The generic request skeleton (``_exchange.paced``) with the aiohttp plug,
    as a middleware: what the throttle's own middleware writes out inline."""
    reader = _ThrottleMiddleware(throttle)

    def middleware(request: ClientRequest, handler: ClientHandlerType) -> Any:
        options = reader._options(request)
        url = request.url
        slot = options.slot or throttle.key_for(url, host=url.raw_host or "")
        return paced(_PLUG, throttle, slot, options, options.max_wait, handler, request)

    return middleware


def _refused(address: str) -> str:
    with socket.socket() as probe:
        probe.bind((address, 0))
        port = probe.getsockname()[1]
    return f"http://{address}:{port}/"  # nothing listens there now


async def _outcome(
    how: str, throttle: Throttle, middleware: Callable[..., Any], host: LoopbackHost
) -> Any:
    """Send the requests of ``how`` through ``middleware`` (the throttle's, or the
    skeleton's) on a session hooked as ThrottledSession hooks one; what the
    caller and the slot saw."""

    async def raising_trace(*args: object) -> None:
        raise KeyError("the caller's own bug")

    trace = aiohttp.TraceConfig()
    if how == "caller's error":
        trace.on_request_headers_sent.append(raising_trace)
    connector = aiohttp.TCPConnector()
    hook_connector(connector)
    session = aiohttp.ClientSession(
        connector=connector, middlewares=(middleware,), trace_configs=[trace]
    )
    hook_request_options(session)
    url = {
        "held": host.url("/stream/3/50"),
        "host failed": _refused(host.address),
        "connection dropped": host.url("/close"),
        "observing raised": host.url("/stream/3/50"),
        "cancelled": host.url("/delay/3000"),
    }.get(how, host.url("/"))
    seen: list[object] = []
    async with session:
        try:
            if how == "timed out":
                await fetch(session, host.url("/status/429?h.Retry-After=30"))
                await fetch(session, url, trace_request_ctx={"autothrottle": {"max_wait": 0.1}})
            elif how == "cancelled":
                task = asyncio.create_task(fetch(session, url))
                await asyncio.sleep(0.3)
                task.cancel()
                await task
            elif how == "options":
                ctx = {"autothrottle": {"slot": "api", "adjust": False}}
                async with session.get(url, trace_request_ctx=ctx) as response:
                    info = throttle_info(response)
                    seen.append(None if info is None else (info.slot, info.adjusted))
                    await response.read()
            else:
                async with session.get(url) as response:
                    seen.append(response.status)
                    seen.append(throttle.slot(key(host)).in_flight)
                    await response.read()
                    info = throttle_info(response)
                    seen.append(None if info is None else (info.slot, info.adjusted))
        except BaseException as error:
            seen.append(type(error).__name__)
    await wait_until(lambda: all(slot.in_flight == 0 for slot in throttle.slots()))
    snaps = sorted((s.snapshot() for s in throttle.slots()), key=lambda snap: snap.key)
    seen.append(
        [(s.key, s.sent, s.responses, dict(s.status_counts), s.failures, s.backoffs) for s in snaps]
    )
    return seen


def _classifier(how: str) -> Any:
    if how != "observing raised":
        return None

    def classifier(status: int, headers: object) -> bool:
        raise LookupError("the caller's own bug")

    return classifier


@pytest.mark.parametrize(
    "how",
    [
        "answered",
        "held",
        "options",
        "host failed",
        "connection dropped",
        "caller's error",
        "observing raised",
        "cancelled",
        "timed out",
    ],
)
async def test_the_middleware_ends_every_outcome_as_the_skeleton_does(how: str) -> None:
    """The throttle's middleware is ``_exchange.paced`` with the aiohttp plug's
    steps written in (fewer calls a request): the same requests through each,
    on sessions hooked alike, end alike for the caller and for the slot."""
    outcomes = []
    async with loopback_hosts(1) as (host,):
        for make in (throttle_middleware, _skeleton_middleware):
            throttle = Throttle(start_delay=0.0, block_classifier=_classifier(how))
            outcomes.append(await _outcome(how, throttle, make(throttle), host))
    ours, skeletons = outcomes
    assert ours == skeletons
    expected_end = {
        "answered": ([200, 0, (key(host), True)], (1, 1, {200: 1}, 0, 0)),
        "held": ([200, 1, (key(host), True)], (1, 1, {200: 1}, 0, 0)),
        "host failed": (["ClientConnectorError"], (1, 0, {}, 1, 1)),
        "observing raised": (["LookupError"], (1, 1, {200: 1}, 0, 0)),
        "cancelled": (["CancelledError"], (1, 0, {}, 0, 0)),
        "caller's error": (["KeyError"], (1, 0, {}, 0, 0)),
    }
    if how in expected_end:
        caller, slot = expected_end[how]
        assert ours[:-1] == caller
        assert ours[-1] == [(key(host), *slot)]
    elif how == "options":
        assert ours[0] == ("api", False)
    elif how == "timed out":
        assert ours[0] == "ThrottleTimeout"
    else:
        assert ours[0] == "ServerDisconnectedError"
        # aiohttp sends a GET again once on a dropped connection: each attempt
        # takes a turn of its own, and each is the host's failure.
        assert ours[-1][0][:5] == (key(host), 2, 0, {}, 2)


@pytest.mark.parametrize("key", [None, lambda url: "by-function:" + url.split("/")[2]])
async def test_the_middleware_keys_a_request_as_the_throttle_does(key: Any) -> None:
    """A request with no option set is keyed by ``host_key`` of its host when the
    throttle has no key function (``key_for``'s answer then, without its call),
    and by ``key_for`` when it has one: the slot each request went to is the
    one ``key_for`` names."""
    from multidict import CIMultiDict
    from yarl import URL

    throttle = Throttle(start_delay=0.0, key=key)
    middleware = throttle_middleware(throttle)

    async def refused(request: Any) -> Any:
        raise ValueError("not sent")  # the caller's error: the lease is only released

    urls = [
        "http://Example.COM./a",
        "http://example.com:8080/b",
        "http://[0:0:0:0:0:0:0:1]:8080/",
        "http://b\u00fccher.example/",
        "https://xn--bcher-kva.example./c?d=e",
    ]
    for text in urls:
        url = URL(text)
        request: Any = SimpleNamespace(url=url, headers=CIMultiDict())
        with pytest.raises(ValueError, match="not sent"):
            await middleware(request, refused)
        want = throttle.key_for(url, host=url.raw_host or "")
        assert request._autothrottle_exchange.lease.slot.key == want
        assert throttle.slot(want).in_flight == 0
    assert len(list(throttle.slots())) == (3 if key is None else 5)  # a port is no new host
