"""The httpx adapter where no wire is needed: respx and mock transports.

respx replaces httpcore's connection pool, so no ``trace`` event fires: these
tests also pin down the fallback latency.
"""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import httpx
import pytest
import respx

from autothrottle import FixedRatePolicy, Throttle, ThrottleTimeout
from autothrottle._httpx._async import _LeaseStream
from autothrottle.httpx import (
    AsyncThrottledClient,
    AsyncThrottledTransport,
    ThrottlePoolTimeout,
)
from httpx_packages import PACKAGES, bind

URL = "http://api.example/items"


@pytest.fixture(autouse=True, params=PACKAGES)
def package(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return bind(globals(), request, monkeypatch)


def client_for(throttle: Throttle, inner: httpx.AsyncBaseTransport | None = None) -> Any:
    return httpx.AsyncClient(transport=AsyncThrottledTransport(inner, throttle=throttle))


@pytest.mark.httpx_only
async def test_fallback_latency_is_the_inner_transports_time() -> None:
    throttle = Throttle(start_delay=0.0)

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        return httpx.Response(200, text="ok")

    with respx.mock:
        respx.get(URL).mock(side_effect=slow)
        async with client_for(throttle) as client:
            response = await client.get(URL)
    assert response.text == "ok"
    slot = throttle.slot("api.example").snapshot()
    assert slot.last_latency is not None and 0.05 <= slot.last_latency < 5.0
    assert (slot.sent, slot.responses, slot.in_flight) == (1, 1, 0)


@pytest.mark.httpx_only
async def test_fallback_latency_excludes_throttle_waiting() -> None:
    throttle = Throttle(start_delay=0.2, min_delay=0.2, max_delay=0.2)
    latencies: list[float | None] = []
    with respx.mock:
        respx.get(URL).mock(return_value=httpx.Response(200))
        async with client_for(throttle) as client:
            for _ in range(2):
                await client.get(URL)
                latencies.append(throttle.slot("api.example").last_latency)
    assert all(latency is not None and latency < 0.15 for latency in latencies), latencies


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"extensions": {"autothrottle": {"adjust": "no"}}}, TypeError, "'adjust'"),
        ({"extensions": {"autothrottle": {"bypass": 1}}}, TypeError, "'bypass'"),
        ({"extensions": {"autothrottle": {"slot": ""}}}, TypeError, "'slot'"),
        ({"extensions": {"autothrottle": {"speed": 2}}}, ValueError, "speed"),
        ({"extensions": {"autothrottle": "bypass"}}, TypeError, "must be a dict"),
        ({"headers": {"X-AutoThrottle": "fast"}}, ValueError, r"X-AutoThrottle.*'fast'"),
        ({"headers": {"X-AutoThrottle": "slot="}}, ValueError, "empty slot name"),
    ],
)
@pytest.mark.httpx_only
async def test_bad_options_raise_before_anything_is_sent_or_held(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    throttle = Throttle(start_delay=0.0)
    with respx.mock(assert_all_called=False):
        route = respx.get(URL).mock(return_value=httpx.Response(200))
        async with client_for(throttle) as client:
            with pytest.raises(error, match=match):
                await client.get(URL, **kwargs)
    assert not route.called
    assert throttle.snapshot() == {}


@pytest.mark.httpx_only
async def test_control_header_is_stripped_and_the_users_request_untouched() -> None:
    throttle = Throttle(start_delay=0.0)
    with respx.mock:
        route = respx.get(URL).mock(return_value=httpx.Response(200))
        async with client_for(throttle) as client:
            request = client.build_request(
                "GET", URL, headers={"X-AutoThrottle": "slot=named", "X-Other": "kept"}
            )
            extensions = request.extensions
            await client.send(request)
        sent = route.calls.last.request
    assert "x-autothrottle" not in sent.headers
    assert sent.headers["x-other"] == "kept"
    assert set(throttle.snapshot()) == {"named"}
    # The request the user holds (and redirect hops built from it) is unchanged.
    assert request.headers["x-autothrottle"] == "slot=named"
    assert request.extensions is extensions and "trace" not in extensions


def _edits() -> list[Any]:
    """Ways a request's headers change between the client building and sending it."""

    def assign(headers: Any) -> None:
        headers["X-AutoThrottle"] = "slot=edited"

    def update(headers: Any) -> None:
        headers.update({"X-AutoThrottle": "slot=edited"})

    def setdefault(headers: Any) -> None:
        headers.setdefault("X-AutoThrottle", "slot=edited")

    def swap(headers: Any) -> None:  # as many headers as before, the last one new
        del headers["accept"]
        headers["X-AutoThrottle"] = "slot=edited"

    def replace(headers: Any) -> Any:  # a new object: the request's attribute set
        return httpx.Headers({**headers, "X-AutoThrottle": "slot=edited"})

    return [assign, update, setdefault, swap, replace]


async def test_a_built_request_whose_headers_change_before_it_is_sent_is_read_again() -> None:
    # The client reads a request's headers as it builds it, and again as it is
    # sent: an edit after the build (the caller's, an auth flow's, an event
    # hook's) that adds the control header counts.
    throttle = Throttle(start_delay=0.0)
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    transport = httpx.MockTransport(handler)
    async with AsyncThrottledClient(throttle=throttle, transport=transport) as client:
        for edit in _edits():
            request = client.build_request("GET", URL)
            replaced = edit(request.headers)
            if replaced is not None:
                request.headers = replaced
            await client.send(request)
            assert request.headers["x-autothrottle"] == "slot=edited"  # the caller's, as edited

        async def hook(request: httpx.Request) -> None:
            request.headers["X-AutoThrottle"] = "slot=edited"

        client.event_hooks = {"request": [hook], "response": []}
        await client.get(URL)
    assert set(throttle.snapshot()) == {"edited"}
    assert throttle.slot("edited").snapshot().sent == len(_edits()) + 1
    assert len(seen) == len(_edits()) + 1
    assert not any("x-autothrottle" in request.headers for request in seen)


async def test_a_bad_control_header_added_after_the_build_is_refused_when_sent() -> None:
    throttle = Throttle(start_delay=0.0)
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    transport = httpx.MockTransport(handler)
    async with AsyncThrottledClient(throttle=throttle, transport=transport) as client:
        request = client.build_request("GET", URL)
        request.headers["X-AutoThrottle"] = "fast"
        with pytest.raises(ValueError, match=r"X-AutoThrottle.*'fast'"):
            await client.send(request)
    assert seen == [] and throttle.snapshot() == {}


async def test_the_control_header_and_a_streamed_body_go_in_one_copy() -> None:
    # Both apply to one request: the copy sent has no control header, and an
    # error its body raised as it was sent is the caller's, not the host's; the
    # caller's own request keeps both.
    throttle = Throttle(start_delay=0.0)
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)  # its body read already, as a transport sends it
        return httpx.Response(200)

    async def body(fail: bool) -> AsyncIterator[bytes]:
        yield b"a"
        if fail:
            raise httpx.ReadError("another host broke its body off")  # a relayed download's

    headers = {"X-AutoThrottle": "slot=named", "X-Other": "kept"}
    async with client_for(throttle, httpx.MockTransport(handler)) as client:
        request = client.build_request("POST", URL, headers=headers, content=body(False))
        assert (await client.send(request)).status_code == 200
        with pytest.raises(httpx.ReadError):
            await client.post(URL, headers=headers, content=body(True))
    assert len(seen) == 1 and "x-autothrottle" not in seen[0].headers
    assert seen[0].headers["x-other"] == "kept" and seen[0].content == b"a"
    assert request.headers["x-autothrottle"] == "slot=named"
    assert seen[0].stream is not request.stream  # read through a wrapper, a copy's
    slot = throttle.slot("named").snapshot()
    assert (slot.sent, slot.responses, slot.failures, slot.in_flight) == (2, 1, 0, 0)


@pytest.mark.httpx_only
async def test_slot_keys() -> None:
    throttle = Throttle(start_delay=0.0)
    by_path = Throttle(start_delay=0.0, key=lambda url: url.split("/")[3])
    with respx.mock:
        respx.get().mock(return_value=httpx.Response(200))
        async with client_for(throttle) as client:
            await client.get("http://API.Example:8080/a")
            await client.get("http://bücher.example/b")
        async with client_for(by_path) as client:
            await client.get("http://one.example/section/x")
            await client.get("http://two.example/section/y")
    assert set(throttle.snapshot()) == {"api.example", "xn--bcher-kva.example"}
    assert by_path.snapshot()["section"].sent == 2


@pytest.mark.httpx_only
async def test_transport_error_releases_and_counts_a_failure() -> None:
    throttle = Throttle(start_delay=0.0)
    with respx.mock:
        respx.get(URL).mock(side_effect=httpx.ConnectTimeout("slow"))
        async with client_for(throttle) as client:
            with pytest.raises(httpx.ConnectTimeout):
                await client.get(URL)
    slot = throttle.slot("api.example").snapshot()
    assert (slot.in_flight, slot.queued, slot.failures, slot.responses) == (0, 0, 1, 0)


@pytest.mark.httpx_only
async def test_cancellation_releases_without_counting_a_failure() -> None:
    throttle = Throttle(start_delay=0.0)

    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    with respx.mock:
        respx.get(URL).mock(side_effect=hang)
        async with client_for(throttle) as client:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await client.get(URL)
    slot = throttle.slot("api.example").snapshot()
    assert (slot.in_flight, slot.queued, slot.failures, slot.sent) == (0, 0, 0, 1)


@pytest.mark.httpx_only
async def test_streamed_response_is_held_until_closed() -> None:
    throttle = Throttle(start_delay=0.0)
    with respx.mock:
        respx.get(URL).mock(return_value=httpx.Response(200, content=b"body"))
        async with client_for(throttle) as client:
            response = await client.send(client.build_request("GET", URL), stream=True)
            assert throttle.slot("api.example").in_flight == 1
            await response.aclose()
            assert throttle.slot("api.example").in_flight == 0


@pytest.mark.httpx_only
async def test_response_already_read_by_the_inner_transport_is_released_at_once() -> None:
    throttle = Throttle(start_delay=0.0)
    router = respx.Router()
    router.get(URL).mock(return_value=httpx.Response(200, content=b"body"))
    inner = httpx.MockTransport(router.async_handler)
    async with client_for(throttle, inner) as client:
        response = await client.send(client.build_request("GET", URL), stream=True)
        assert response.is_closed
        assert throttle.slot("api.example").in_flight == 0


class _Chunks(httpx.AsyncByteStream):
    def __init__(self) -> None:
        self.closed = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"

    async def aclose(self) -> None:
        self.closed += 1


async def test_lease_stream_releases_on_close_once() -> None:
    throttle = Throttle(start_delay=0.0, max_delay=0.0)
    inner = _Chunks()
    stream = _LeaseStream(inner, await throttle.acquire("k"))
    assert throttle.slot("k").in_flight == 1
    assert [chunk async for chunk in stream] == [b"a", b"b"]  # the inner stream's own
    await stream.aclose()
    assert throttle.slot("k").in_flight == 0
    await stream.aclose()  # idempotent
    assert inner.closed == 2 and throttle.slot("k").in_flight == 0


def mocked(body: type[httpx.AsyncByteStream]) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(200, stream=body()))


async def test_a_body_read_to_the_end_releases_before_the_streams_close() -> None:
    # httpx closes the stream once the body is read: the turn is free by then.
    throttle = Throttle(start_delay=0.0, max_delay=0.0)
    async with client_for(throttle, mocked(_Chunks)) as client:
        assert (await client.get(URL)).content == b"ab"
        assert throttle.slot("api.example").in_flight == 0
        async with client.stream("GET", URL) as response:
            assert throttle.slot("api.example").in_flight == 1
            assert [chunk async for chunk in response.aiter_bytes()] == [b"a", b"b"]
            assert throttle.slot("api.example").in_flight == 0


async def test_a_body_that_fails_midway_releases() -> None:
    class Broken(_Chunks):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b"a"
            raise httpx.ReadError("reset")

    throttle = Throttle(start_delay=0.0)
    async with client_for(throttle, mocked(Broken)) as client:
        with pytest.raises(httpx.ReadError):
            await client.get(URL)
        assert throttle.slot("api.example").in_flight == 0
        with pytest.raises(httpx.ReadError):
            async with client.stream("GET", URL) as response:
                await response.aread()
        assert throttle.slot("api.example").in_flight == 0


async def test_a_body_whose_reading_is_cancelled_releases() -> None:
    class Hanging(_Chunks):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b"a"
            await asyncio.sleep(3600)
            yield b"never"

    throttle = Throttle(start_delay=0.0)
    async with client_for(throttle, mocked(Hanging)) as client:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await client.get(URL)
        assert throttle.slot("api.example").in_flight == 0
        chunks: list[bytes] = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1), client.stream("GET", URL) as response:
                async for chunk in response.aiter_bytes():
                    chunks.append(chunk)
        assert chunks == [b"a"]
        assert throttle.slot("api.example").in_flight == 0


def test_constructors_reject_bad_arguments() -> None:
    throttle = Throttle()
    with pytest.raises(TypeError, match=r"throttle must be .*got None"):
        AsyncThrottledTransport(throttle=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"inner must be .*got 'http'"):
        AsyncThrottledTransport("http", throttle=throttle)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"throttle must be .*got 3"):
        AsyncThrottledClient(throttle=3)  # type: ignore[arg-type]


class _Recorder:
    """An inner transport that records its lifecycle calls (any package's)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __aenter__(self) -> _Recorder:
        self.calls.append("enter")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self.calls.append("exit")

    async def aclose(self) -> None:
        self.calls.append("close")


async def test_transport_lifecycle_reaches_the_inner_transport() -> None:
    inner: Any = type("Recorder", (_Recorder, httpx.AsyncBaseTransport), {})()
    calls: list[str] = inner.calls  # what the inner transport was asked, as it is asked
    async with AsyncThrottledTransport(inner, throttle=Throttle()) as transport:
        assert transport.inner is inner
    await transport.aclose()
    assert calls == ["enter", "exit", "close"]


async def test_throttled_client_wraps_every_route() -> None:
    throttle = Throttle()
    mounted = httpx.AsyncHTTPTransport()
    async with AsyncThrottledClient(
        throttle=throttle,
        proxy="http://proxy.example:3128",
        mounts={"http://mounted.example": mounted, "http://direct.example": None},
    ) as client:
        routes = {
            url: client._transport_for_url(httpx.URL(url))
            for url in ("http://mounted.example", "http://direct.example", "http://other.example")
        }
    assert all(isinstance(t, AsyncThrottledTransport) for t in routes.values())
    assert isinstance(client._transport, AsyncThrottledTransport)
    mounted_route = routes["http://mounted.example"]
    assert isinstance(mounted_route, AsyncThrottledTransport) and mounted_route.inner is mounted
    assert routes["http://direct.example"] is client._transport
    assert all(
        t.throttle is throttle for t in routes.values() if isinstance(t, AsyncThrottledTransport)
    )


# -- httpx's pool timeout and the wait for the turn ------------------------------------
# On looptime's fake-time loop, with the throttle reading the loop's clock: eight
# requests gathered at one a second wait up to 7 s for their turns, past httpx's
# default 5 s pool timeout, without a real second passing.


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def _ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200)


async def _eight(client: Any) -> list[object]:
    answers: list[object] = await asyncio.gather(
        *(client.get(URL) for _ in range(8)), return_exceptions=True
    )
    return answers


def _client(kind: str, throttle: Throttle, **kwargs: Any) -> Any:
    inner = httpx.MockTransport(_ok)
    if kind == "AsyncThrottledClient":
        return AsyncThrottledClient(throttle=throttle, transport=inner, **kwargs)
    if kind == "AsyncThrottledClient, its transport given as is":
        given = AsyncThrottledTransport(inner, throttle=throttle)
        return AsyncThrottledClient(throttle=throttle, transport=given, **kwargs)
    return httpx.AsyncClient(transport=AsyncThrottledTransport(inner, throttle=throttle), **kwargs)


@pytest.mark.looptime
@pytest.mark.parametrize(
    "kind",
    [
        "AsyncThrottledClient",
        "httpx.AsyncClient",
        "AsyncThrottledClient, its transport given as is",
    ],
)
async def test_httpxs_default_timeout_never_fails_a_wait_for_the_turn(kind: str) -> None:
    throttle = Throttle(policy=FixedRatePolicy(1.0), clock=_loop_time)
    async with _client(kind, throttle) as client:
        started = _loop_time()
        results = await _eight(client)
    assert [getattr(r, "status_code", r) for r in results] == [200] * 8
    assert _loop_time() - started == pytest.approx(7.0, abs=0.01)  # they did wait


@pytest.mark.looptime
@pytest.mark.parametrize("kind", ["AsyncThrottledClient", "httpx.AsyncClient"])
@pytest.mark.parametrize("where", ["client", "request"])
async def test_a_pool_timeout_you_set_bounds_the_wait_and_says_so(
    kind: str, where: str, package: str
) -> None:
    throttle = Throttle(policy=FixedRatePolicy(1.0), clock=_loop_time)
    timeout = httpx.Timeout(5.0, pool=2.5)
    on_client = {"timeout": timeout} if where == "client" else {}
    async with _client(kind, throttle, **on_client) as client:
        per_request = {} if where == "client" else {"timeout": timeout}
        results = await asyncio.gather(
            *(client.get(URL, **per_request) for _ in range(8)), return_exceptions=True
        )
    ok = [r for r in results if isinstance(r, httpx.Response)]
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(ok) == 3  # sent at 0, 1 and 2 s; the others would wait past 2.5 s
    assert len(failed) == 5
    for error in failed:
        assert isinstance(error, ThrottlePoolTimeout)
        assert isinstance(error, httpx.PoolTimeout) and isinstance(error, ThrottleTimeout)
        assert error.bound == f"{package} pool timeout"
        assert f"({package} pool timeout)" in str(error) and "max_wait" not in str(error)
        assert type(error).__module__ == f"autothrottle.{package}"
        assert not type(error).__name__.startswith("_")


@pytest.mark.looptime
@pytest.mark.parametrize(
    "kind", ["AsyncThrottledClient", "AsyncThrottledClient, its transport given as is"]
)
async def test_a_default_timeout_set_explicitly_on_the_client_is_a_choice(kind: str) -> None:
    throttle = Throttle(policy=FixedRatePolicy(0.9), clock=_loop_time)
    async with _client(kind, throttle, timeout=5.0) as client:
        results = await _eight(client)
    # Turns at 0, 1.1, ... 4.4 s; the three at 5.6, 6.7 and 7.8 s are past 5 s.
    assert sum(isinstance(r, ThrottlePoolTimeout) for r in results) == 3


@pytest.mark.looptime
async def test_a_timeout_set_on_the_client_later_is_a_choice_too() -> None:
    throttle = Throttle(policy=FixedRatePolicy(1.0), clock=_loop_time)
    async with _client("AsyncThrottledClient", throttle) as client:
        client.timeout = httpx.Timeout(5.0, pool=0.5)
        results = await _eight(client)
    assert sum(isinstance(r, ThrottlePoolTimeout) for r in results) == 7


@pytest.mark.looptime
async def test_max_wait_still_bounds_a_wait_under_httpxs_defaults() -> None:
    throttle = Throttle(policy=FixedRatePolicy(1.0), clock=_loop_time, max_wait=3.5)
    async with _client("AsyncThrottledClient", throttle) as client:
        results = await _eight(client)
    failed = [r for r in results if isinstance(r, ThrottlePoolTimeout)]
    assert len(failed) == 4
    assert all(e.bound == "max_wait" and "(max_wait)" in str(e) for e in failed)


def test_a_pool_timeout_set_on_a_sync_client_bounds_a_threads_wait(package: str) -> None:
    ThrottledClient = importlib.import_module(f"autothrottle.{package}").ThrottledClient
    throttle = Throttle(start_delay=0.0)
    throttle.backoff("api.example", pause=30.0)
    inner = httpx.MockTransport(_ok)
    timeout = httpx.Timeout(5.0, pool=0.1)
    client = ThrottledClient(throttle=throttle, transport=inner, timeout=timeout)
    with client, pytest.raises(ThrottlePoolTimeout, match=f"{package} pool timeout"):
        client.get(URL)
    assert throttle.slot("api.example").queued == 0


# -- what the first request costs ---------------------------------------------------------


def test_the_client_imports_its_http_core_as_it_is_built_not_in_a_request(
    package: str,
) -> None:
    # Plain httpx imports httpcore as the client is built. The pools are made at
    # each origin's first request: left to them, that import (about a second on
    # a busy machine) would block the event loop in the middle of a crawl.
    # (httpx before 0.28 imports httpcore with itself: nothing to put off there.)
    core = {"httpx": "httpcore", "httpx2": "httpcore2"}[package]
    code = (
        "import sys\n"
        f"import {package}\n"
        f"eager = {core!r} in sys.modules\n"
        "from autothrottle import Throttle\n"
        f"from autothrottle.{package} import AsyncThrottledClient\n"
        f"assert eager or {core!r} not in sys.modules, 'imported with the adapter already'\n"
        "AsyncThrottledClient(throttle=Throttle())\n"
        f"assert {core!r} in sys.modules, 'not imported as the client was built'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
