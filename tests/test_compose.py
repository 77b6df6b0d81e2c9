"""Composition with the rest of a stack: mocks, trio, tracing, what a response says.

Pacing is asserted where it happens: at a loopback server, or, for mocks that
never reach a wire, through the slot's own counters and a fake clock.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import threading
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import respx

from autothrottle import FixedDelayPolicy, Throttle, ThrottleInfo
from autothrottle.aiohttp import (
    ThrottledSession,
    throttle_info,
    throttle_middleware,
    throttle_of,
    throttle_trace_config,
)
from autothrottle.httpx import AsyncThrottledClient, AsyncThrottledTransport, ThrottledClient
from loopback import loopback_hosts, promptly


def waited_within_its_gap(
    waited: float, first_sent: float, second_sent: float, arrivals: list[float]
) -> None:
    """A second request right after a first, under FixedDelayPolicy(0.2): its
    turn came a delay after the first's (less the lead a spaced grant may
    take, at most a quarter of the gap: docs/scheduling.md, rule 10), and
    what it waited (seconds, from its ask until its wire turn) is within the
    gap between the two arrivals at the host: it asked after the first's
    answer came back, so after the first arrived, and went on the wire before
    it arrived itself. Not within the gap between the grants: the wire turn
    may hold a granted request past its grant (the lead, and a strict pace
    counted from when the first may have reached the host), and a loop
    standing still between the grant and the wire widens the wait and not
    that gap. Bounds that load cannot flip: a stall only widens the gaps, and
    shortens the wait by as much as it widens anything the wait is held to."""
    assert second_sent - first_sent >= 0.75 * 0.2 - 1e-3, (first_sent, second_sent)
    assert len(arrivals) == 2, arrivals
    assert 0.0 <= waited <= arrivals[1] - arrivals[0], (waited, arrivals)


@pytest.mark.parametrize("using", ["httpcore", "httpx"])
async def test_respx_requests_are_paced_in_every_mode(using: str) -> None:
    throttle = Throttle(policy=FixedDelayPolicy(30.0))
    with respx.mock(using=using) as mock:
        mock.get("http://api.example/").respond(200, text="ok")
        async with AsyncThrottledClient(throttle=throttle) as http:
            assert (await http.get("http://api.example/")).status_code == 200
            with pytest.raises(asyncio.TimeoutError):
                async with asyncio.timeout(0.3):  # the second waits its 30 s turn
                    await http.get("http://api.example/")
    slot = throttle.slot("api.example")
    assert (slot.snapshot().responses, slot.in_flight, slot.queued) == (1, 0, 0)


def test_respx_with_the_sync_client_is_paced_too() -> None:
    throttle = Throttle(start_delay=0.0)
    with respx.mock(using="httpx") as mock, ThrottledClient(throttle=throttle) as http:
        mock.get("http://api.example/").respond(200)
        assert http.get("http://api.example/").status_code == 200
    assert throttle.slot("api.example").snapshot().responses == 1


async def test_the_response_says_what_the_throttle_did_under_httpx() -> None:
    throttle = Throttle(policy=FixedDelayPolicy(0.2))
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as http:
        first = await http.get(host.url("/"))
        second = await http.get(host.url("/"), headers={"X-AutoThrottle": "no-adjust"})
        arrivals = host.arrival_times()
    info = second.extensions["autothrottle"]
    assert isinstance(info, ThrottleInfo)
    assert info.slot == host.address
    sent = first.extensions["autothrottle"].sent_at
    waited_within_its_gap(info.waited, sent, info.sent_at, arrivals)
    assert info.adjusted is False
    assert throttle.backoff(host.url("/"), sent_at=info.sent_at) is True


async def test_the_response_says_what_the_throttle_did_under_aiohttp() -> None:
    throttle = Throttle(policy=FixedDelayPolicy(0.2))
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        assert throttle_of(session) is throttle
        async with session.get(host.url("/")) as first:
            await first.read()
            before = throttle_info(first)
        async with session.get(host.url("/")) as second:
            await second.read()
            info = throttle_info(second)
        arrivals = host.arrival_times()
    assert info is not None and before is not None
    assert (info.slot, info.adjusted) == (host.address, True)
    waited_within_its_gap(info.waited, before.sent_at, info.sent_at, arrivals)
    async with aiohttp.ClientSession() as plain:
        assert throttle_of(plain) is None


def test_trio_paces_at_the_wire_too() -> None:
    trio = pytest.importorskip("trio")

    delay = 0.1
    throttle = Throttle(policy=FixedDelayPolicy(delay))
    arrivals: list[float] = []
    ready = threading.Event()
    stop = asyncio.Event()
    port: list[int] = []

    async def serve() -> None:
        async with loopback_hosts(1) as (host,):
            port.append(host.port)
            ready.set()
            await stop.wait()
            arrivals.extend(host.arrival_times())

    loop = asyncio.new_event_loop()
    server = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    server.start()
    assert ready.wait(30)

    async def crawl() -> None:
        async with AsyncThrottledClient(throttle=throttle) as http, trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(http.get, f"http://127.0.0.2:{port[0]}/")

    try:
        with promptly():  # the gaps at the host are the wire turn's, not the run queue's
            trio.run(crawl)
    finally:
        loop.call_soon_threadsafe(stop.set)
        server.join(30)
        loop.close()
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert len(arrivals) == 4
    # The loopback server stamps arrivals in a process of its own, ahead of
    # ordinary ones, and trio's thread sends raised too; before both were (the
    # server then a thread of this process) a loaded machine stamped one
    # arrival late and the next gap read short by as much (107 ms then 94 ms
    # for 100 ms). Unpaced, the gaps would be ~1 ms.
    assert min(gaps) >= delay - 0.015, gaps
    assert arrivals[-1] - arrivals[0] >= 3 * delay - 0.005, gaps


async def test_an_active_span_records_the_throttles_wait() -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider: Any = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    throttle = Throttle(policy=FixedDelayPolicy(0.2))
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as http:
        first = await http.get(host.url("/"))
        with tracer.start_as_current_span("GET"):
            second = await http.get(host.url("/"))
        arrivals = host.arrival_times()
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["autothrottle.slot"] == host.address
    waited = float(span.attributes["autothrottle.wait_s"])  # type: ignore[arg-type]
    info = second.extensions["autothrottle"]
    assert waited <= info.waited  # (read a moment before the response's: test_exchange)
    waited_within_its_gap(waited, first.extensions["autothrottle"].sent_at, info.sent_at, arrivals)


@pytest.mark.parametrize(
    ("throttled", "plain"),
    [(AsyncThrottledClient, httpx.AsyncClient), (ThrottledClient, httpx.Client)],
)
def test_the_throttled_clients_declare_every_parameter_of_httpxs(
    throttled: Any, plain: Any
) -> None:
    # Typed keyword arguments let mypy and IDEs catch `transprt=`; they must
    # keep up with httpx's own parameters.
    annotation = inspect.signature(throttled.__init__).parameters["kwargs"].annotation
    assert annotation.startswith("Unpack[")
    options = inspect.unwrap(throttled.__init__).__globals__[annotation[len("Unpack[") : -1]]
    declared = options.__required_keys__ | options.__optional_keys__
    expected = set(inspect.signature(plain.__init__).parameters) - {"self"}
    assert declared == expected


async def test_a_throttled_aiohttp_session_is_tested_against_simulated_hosts() -> None:
    # The docs/compose.md recipe: aioresponses cannot see requests through
    # aiohttp's middlewares, so test against autothrottle.sim on loopback.
    from autothrottle.sim import RateLimited, SimServer

    throttle = Throttle(start_delay=0.0)
    async with (
        SimServer({"127.0.0.2": RateLimited(rate=5, burst=1)}) as sim,
        ThrottledSession(throttle=throttle) as session,
    ):
        for _ in range(10):
            async with session.get(sim.url("127.0.0.2")) as response:
                await response.read()
        stats = sim.host_stats("127.0.0.2")
        (slot,) = throttle.snapshot().values()
    assert stats.requests == 10
    assert stats.max_in_window <= 5 + 1  # paced by the host's rate-limit headers
    # Paced at exactly the stated 5/s, a strict host that shares the client's
    # event loop (and two busy cores) may stamp one request late and refuse
    # the next as early: jitter no client can see. It costs an arrival margin
    # step, not a backoff: the pace stays the host's (a backoff would hold the
    # delay at 0.2 s or more for the recovery time, docs/recovery.md).
    assert stats.statuses.get(200, 0) >= 9
    assert slot.delay < 0.2


def test_per_path_slots_from_a_key_function_get_their_own_settings() -> None:
    import yarl

    def slot_of(url: str) -> str:
        parts = yarl.URL(url)
        host = parts.host or ""
        return f"{host}/search" if parts.path.startswith("/search") else host

    throttle = Throttle(
        start_delay=0.0, key=slot_of, hosts={"api.example.com/search": {"min_delay": 2.0}}
    )
    search = throttle.key_for("https://api.example.com/search?q=x")
    assert search == "api.example.com/search"
    assert throttle.key_for("https://api.example.com/items") == "api.example.com"
    assert throttle.slot(search).config.min_delay == 2.0
    assert throttle.slot("api.example.com").config.min_delay == 0.0


# -- caches -------------------------------------------------------------------------


def _hishel_transport(inner: httpx.AsyncBaseTransport, path: Path) -> httpx.AsyncBaseTransport:
    hishel_httpx = pytest.importorskip("hishel.httpx")
    hishel = pytest.importorskip("hishel")
    storage = hishel.AsyncSqliteStorage(database_path=str(path / "cache.db"))
    transport: httpx.AsyncBaseTransport = hishel_httpx.AsyncCacheTransport(
        next_transport=inner, storage=storage
    )
    return transport


@pytest.mark.parametrize(
    "order", ["cache given to AsyncThrottledClient", "cache around the throttle"]
)
async def test_a_hishel_hit_neither_waits_nor_teaches(order: str, tmp_path: Path) -> None:
    throttle = Throttle(policy=FixedDelayPolicy(30.0))
    async with loopback_hosts(1) as (host,):
        if order == "cache given to AsyncThrottledClient":
            cache = _hishel_transport(httpx.AsyncHTTPTransport(), tmp_path)
            client: httpx.AsyncClient = AsyncThrottledClient(throttle=throttle, transport=cache)
        else:
            cache = _hishel_transport(AsyncThrottledTransport(throttle=throttle), tmp_path)
            client = httpx.AsyncClient(transport=cache)
        async with client:
            first = await client.get(host.url("/"))
            await first.aread()
            async with asyncio.timeout(10):  # a paced request would wait 30 s
                second = await client.get(host.url("/"))
                await second.aread()
    assert second.text == "ok"
    assert len(host.arrivals) == 1
    snap = throttle.slot(host.address).snapshot()
    assert (snap.responses, snap.in_flight) == (1, 0)


async def test_a_hishel_hit_below_the_throttle_waits_and_counts_as_a_hit(
    tmp_path: Path,
) -> None:
    throttle = Throttle(policy=FixedDelayPolicy(0.4))
    async with loopback_hosts(1) as (host,):
        cache = _hishel_transport(httpx.AsyncHTTPTransport(), tmp_path)
        async with httpx.AsyncClient(
            transport=AsyncThrottledTransport(cache, throttle=throttle)
        ) as c:
            responses = []
            for _ in range(4):
                responses.append(await c.get(host.url("/")))
                await responses[-1].aread()
    assert len(host.arrivals) == 1
    # Judged by when the throttle granted each turn, not by what each waited:
    # a loop standing still between two requests shortens the next one's wait
    # but can only lengthen a gap, so these lower bounds hold under any load.
    # A spaced grant may come early by up to a quarter of its gap (rule 10 of
    # docs/scheduling.md: the wire turn keeps the whole gap for a miss).
    sent = [r.extensions["autothrottle"].sent_at for r in responses]
    gaps = [later - earlier for earlier, later in itertools.pairwise(sent)]
    # The hits waited their turn (the throttle cannot know the cache will answer) ...
    assert gaps[0] >= 0.75 * 0.4 - 1e-3 and gaps[1] >= 0.75 * 0.4 - 1e-3, gaps
    snap = throttle.slot(host.address).snapshot()
    assert (snap.responses, snap.cache_hits) == (4, 3)
    # ... taught no latency of the origin's, and lowered the slot's miss share,
    # and the pace with it: the origin's 400 ms gap leaves room for hits (from
    # the gap after the one a hit lowered it in: a gap begun is kept, so the
    # fourth's gap is still at least half the second's).
    state = throttle.store.load(host.address)
    assert state is not None and state.miss_share < 1.0
    assert gaps[2] >= 0.75 * 0.2 - 1e-3, gaps
    assert snap.delay < 0.4, snap


async def test_an_aiohttp_client_cache_hit_neither_waits_nor_teaches() -> None:
    cache = pytest.importorskip("aiohttp_client_cache")
    throttle = Throttle(policy=FixedDelayPolicy(30.0))
    async with (
        loopback_hosts(1) as (host,),
        cache.CachedSession(
            cache=cache.CacheBackend(),
            middlewares=(throttle_middleware(throttle),),
            trace_configs=[throttle_trace_config()],
        ) as session,
    ):
        for _ in range(2):
            async with asyncio.timeout(10), session.get(host.url("/")) as response:
                assert await response.text() == "ok"
    assert len(host.arrivals) == 1
    assert throttle.slot(host.address).snapshot().responses == 1


async def test_aiohttp_raise_for_status_and_base_url_keep_the_throttle_in_the_loop() -> None:
    # raise_for_status runs after the middlewares: the 429 still teaches the
    # slot, the caller gets aiohttp's own ClientResponseError, and nothing is held.
    throttle = Throttle(start_delay=0.0)
    async with (
        loopback_hosts(1) as (host,),
        ThrottledSession(throttle=throttle, base_url=host.origin, raise_for_status=True) as session,
    ):
        async with session.get("/") as ok:
            assert ok.status == 200
        with pytest.raises(aiohttp.ClientResponseError) as caught:
            async with session.get("/status/429"):
                pass
    assert caught.value.status == 429
    snap = throttle.slot(host.address).snapshot()
    assert (snap.responses, snap.backoffs, snap.in_flight) == (2, 1, 0)


#: ``aiohttp.ClientSession``'s keywords in aiohttp 3.12.0, the oldest release
#: ``aiohttp>=3.12`` allows: ThrottledSession offers exactly these.
AIOHTTP_3_12_0_KEYWORDS = {
    "auth", "auto_decompress", "base_url", "conn_timeout", "connector", "connector_owner",
    "cookie_jar", "cookies", "fallback_charset_resolver", "headers", "json_serialize", "loop",
    "max_field_size", "max_line_size", "middlewares", "proxy", "proxy_auth",
    "raise_for_status", "read_bufsize", "read_timeout", "request_class",
    "requote_redirect_url", "response_class", "skip_auto_headers", "timeout",
    "trace_configs", "trust_env", "version", "ws_response_class",
}  # fmt: skip


def test_throttled_session_declares_the_keywords_of_every_allowed_aiohttp() -> None:
    import autothrottle.aiohttp as adapter

    annotation = inspect.signature(ThrottledSession).parameters["kwargs"].annotation
    assert annotation == "Unpack[_SessionOptions]"
    options = adapter._SessionOptions
    declared = options.__required_keys__ | options.__optional_keys__ | {"base_url"}
    installed = set(inspect.signature(aiohttp.ClientSession.__init__).parameters) - {"self"}
    # Every keyword offered is accepted by this aiohttp and by the oldest allowed
    # (a keyword added later, such as max_headers, would fail there at run time).
    assert declared == AIOHTTP_3_12_0_KEYWORDS
    assert declared <= installed
