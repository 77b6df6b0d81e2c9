"""A user's walk through the httpx adapter with the client settings people pass.

The usual request is measured and tested elsewhere; these are the settings
around it (``follow_redirects``, a transport's ``retries``, ``limits``,
``event_hooks``, an ``auth`` that sends again, a streamed body given up
half-read), each against real loopback servers, kept where it can break.
docs/adapters.md, "With your client's own settings", says what they found.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from aiohttp import web

from autothrottle import Throttle
from autothrottle.httpx import AsyncThrottledClient, ThrottledClient, ThrottlePoolTimeout
from helpers import fixed, wait_until
from httpx_packages import PACKAGES, bind
from loopback import LoopbackHost, loopback_hosts, running_hosts, served_here


@pytest.fixture(autouse=True, params=PACKAGES)
def package(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return bind(globals(), request, monkeypatch)


def assert_idle(throttle: Throttle, *keys: str) -> None:
    for key in keys:
        slot = throttle.slot(key)
        assert (slot.in_flight, slot.queued) == (0, 0), key


def free_port(address: str) -> int:
    """A port nothing listens on at ``address``: a connection there is refused."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """No garbage collection in the block: what is released there was released
    by reference counting, whenever the collector would have run."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# -- servers of our own ----------------------------------------------------------------


class _Site:
    """Two loopback addresses served in this process: a redirect loop between
    them, and a page behind HTTP digest authentication. What arrived, in order."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.arrivals: list[tuple[str, str, float, dict[str, str]]] = []
        app = web.Application()
        app.router.add_route("*", "/loop", self._loop)
        app.router.add_route("*", "/digest", self._digest)
        self.app = app

    def _note(self, request: web.Request) -> None:
        host = request.host.rsplit(":", 1)[0]
        self.arrivals.append((host, request.path, time.monotonic(), dict(request.headers)))

    async def _loop(self, request: web.Request) -> web.Response:
        self._note(request)
        here = request.host.rsplit(":", 1)[0]
        other = next(url for url in self.urls if f"//{here}:" not in url)
        raise web.HTTPFound(other + "loop")

    async def _digest(self, request: web.Request) -> web.Response:
        # The answer httpx's DigestAuth needs to send again, and the page once
        # it has: the credentials themselves are not what is tested.
        self._note(request)
        if request.headers.get("Authorization", "").startswith("Digest "):
            return web.Response(text="in")
        challenge = 'Digest realm="walk", nonce="n0", qop="auth", opaque="o", algorithm=MD5'
        return web.Response(status=401, headers={"WWW-Authenticate": challenge})


@asynccontextmanager
async def site(*addresses: str) -> AsyncIterator[_Site]:
    served = _Site()
    async with served_here(list(addresses), served.app) as urls:
        served.urls = urls
        yield served


# -- redirects ------------------------------------------------------------------------


async def test_a_redirect_loop_ends_at_max_redirects_each_hop_on_its_own_host() -> None:
    throttle = Throttle(start_delay=0.0)
    async with (
        site("127.0.0.2", "127.0.0.3") as served,
        AsyncThrottledClient(throttle=throttle, follow_redirects=True, max_redirects=5) as client,
    ):
        with pytest.raises(httpx.TooManyRedirects):
            await client.get(served.urls[0] + "loop")
    # The first request and five hops, alternating: three on each host's slot.
    assert [host for host, *_ in served.arrivals] == ["127.0.0.2", "127.0.0.3"] * 3
    snapshot = throttle.snapshot()
    for key in ("127.0.0.2", "127.0.0.3"):
        assert (snapshot[key].sent, dict(snapshot[key].status_counts)) == (3, {302: 3})
    assert_idle(throttle, "127.0.0.2", "127.0.0.3")


# -- a transport that retries its connects ---------------------------------------------


@pytest.mark.parametrize("given", ["transport", "mounts"])
async def test_a_transports_connect_retries_are_one_turn_and_let_it_go(given: str) -> None:
    # httpcore retries a refused connect inside the one request the throttle
    # sees: one turn, one failure, and the turn let go, so the host's next
    # request (capped at one at a time) goes.
    throttle = Throttle(start_delay=0.0, max_concurrency=1, max_wait=10.0)
    address = "127.0.0.4"
    inner = httpx.AsyncHTTPTransport(retries=2)
    kwargs: dict[str, Any] = (
        {"transport": inner} if given == "transport" else {"mounts": {"http://": inner}}
    )
    async with site(address) as served, AsyncThrottledClient(throttle=throttle, **kwargs) as client:
        started = time.monotonic()
        refused = asyncio.create_task(client.get(f"http://{address}:{free_port(address)}/"))
        await wait_until(lambda: throttle.slot(address).in_flight == 1)
        # The same host, served: its turn comes once httpcore gave up retrying.
        response = await client.get(served.urls[0] + "digest")
        assert refused.done()
        with pytest.raises(httpx.ConnectError):
            await refused
        assert time.monotonic() - started >= 0.4  # httpcore's backoff: it did retry
    assert response.status_code == 401
    slot = throttle.slot(address).snapshot()
    assert (slot.sent, slot.failures, dict(slot.status_counts)) == (2, 1, {401: 1})
    assert_idle(throttle, address)


# -- limits and the pool timeout --------------------------------------------------------


async def _twenty(client: httpx.AsyncClient, hosts: list[LoopbackHost]) -> list[Any]:
    urls = [host.url(f"/{i}") for i in range(5) for host in hosts]
    return await asyncio.gather(*(client.get(url) for url in urls), return_exceptions=True)


@pytest.mark.parametrize("per_host", [None, False])
async def test_requests_queued_by_the_throttle_past_httpxs_pool_timeout_do_not_fail(
    per_host: bool | None,
) -> None:
    # Five requests a host at 1.3 s apart: the last waits 5.2 s for its turn,
    # past httpx's default 5-s pool timeout, which bounds no turn; two
    # connections (per origin, or for all four hosts) serve them all.
    throttle = fixed(1.3)
    limits = httpx.Limits(max_connections=2)
    async with (
        loopback_hosts(4) as hosts,
        AsyncThrottledClient(throttle=throttle, limits=limits, pool_per_host=per_host) as client,
    ):
        results = await _twenty(client, hosts)
    assert [getattr(r, "status_code", r) for r in results] == [200] * 20
    for host in hosts:
        assert len(host.arrivals) == 5
    assert_idle(throttle, *(host.address for host in hosts))


async def test_a_pool_timeout_you_set_still_bounds_the_wait_for_the_turn(package: str) -> None:
    throttle = fixed(30.0)
    limits = httpx.Limits(max_connections=2)
    timeout = httpx.Timeout(10.0, pool=0.5)
    async with (
        loopback_hosts(4) as hosts,
        AsyncThrottledClient(throttle=throttle, limits=limits, timeout=timeout) as client,
    ):
        started = time.monotonic()
        results = await _twenty(client, hosts)
        waited = time.monotonic() - started
    assert [getattr(r, "status_code", None) for r in results[:4]] == [200] * 4
    refused = results[4:]
    assert all(isinstance(r, ThrottlePoolTimeout) for r in refused), refused
    assert {r.bound for r in refused} == {f"{package} pool timeout"}
    assert waited < 20.0  # the bound, not the 30-s turn
    for host in hosts:
        assert [a.path for a in host.arrivals] == ["/0"]
    assert_idle(throttle, *(host.address for host in hosts))


# -- event hooks and an auth that sends again -------------------------------------------


@pytest.mark.parametrize("control", [False, True])
async def test_an_auth_that_sends_again_and_event_hooks_take_one_turn_a_wire_request(
    control: bool,
) -> None:
    # DigestAuth sends the request, reads the 401 and sends it again with its
    # answer; the hooks run for each. Each is its own turn, spaced by the
    # delay, and nothing is counted twice. A request hook that adds the
    # control header (after the client built the request, on the request
    # DigestAuth edits) chooses the slot of both sends.
    delay = 0.2
    throttle = fixed(delay)
    hooks: list[str] = []

    async def on_request(request: httpx.Request) -> None:
        hooks.append("request")
        if control:
            request.headers["X-AutoThrottle"] = "slot=auth"

    async def on_response(response: httpx.Response) -> None:
        hooks.append(f"response {response.status_code}")

    address = "127.0.0.5"
    async with (
        site(address) as served,
        AsyncThrottledClient(
            throttle=throttle,
            auth=httpx.DigestAuth("user", "secret"),
            event_hooks={"request": [on_request], "response": [on_response]},
        ) as client,
    ):
        first = await client.get(served.urls[0] + "digest")
        second = await client.get(served.urls[0] + "digest")
    assert (first.status_code, [r.status_code for r in first.history]) == (200, [401])
    assert (second.status_code, second.history) == (200, [])  # the challenge known
    sends = ["request", "response 401", "request", "response 200", "request", "response 200"]
    assert hooks == sends
    key = "auth" if control else address
    assert set(throttle.snapshot()) == {key}
    slot = throttle.slot(key).snapshot()
    assert (slot.sent, dict(slot.status_counts)) == (3, {401: 1, 200: 2})
    assert [bool(headers.get("Authorization")) for *_, headers in served.arrivals] == [
        False,
        True,
        True,
    ]
    assert not any("X-AutoThrottle" in headers for *_, headers in served.arrivals)
    times = [at for _, _, at, _ in served.arrivals]
    # Stamped by a server on this event loop: late by the loop's lag, never early.
    assert all(b - a >= delay / 2 for a, b in itertools.pairwise(times)), times
    assert_idle(throttle, key)


# -- a streamed body given up half-read --------------------------------------------------


async def _give_up(client: httpx.AsyncClient, url: str, how: str, closed: bool) -> None:
    """Read one chunk of a long body, then stop: by ``break`` or by the reading
    task being cancelled; inside ``client.stream``'s block (``closed``) or on
    a response from ``send(stream=True)`` that nothing closes."""

    async def read() -> None:
        if closed:
            async with client.stream("GET", url) as response:
                async for _ in response.aiter_bytes():
                    if how == "break":
                        break
                    reading.set()
            return
        response = await client.send(client.build_request("GET", url), stream=True)
        async for _ in response.aiter_bytes():
            if how == "break":
                break
            reading.set()

    reading = asyncio.Event()
    task = asyncio.create_task(read())
    if how == "cancel":
        await reading.wait()
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    del task


@pytest.mark.parametrize("closed", [True, False], ids=["in-stream-block", "never-closed"])
@pytest.mark.parametrize("how", ["break", "cancel"])
async def test_a_body_given_up_half_read_lets_the_next_request_go(how: str, closed: bool) -> None:
    # One request at a time: the next one goes only once the first is
    # released. Inside `client.stream` the block's exit closes the response.
    # A response nothing closes is let go once httpx has closed its iterators
    # of the body (as httpx's own pool gets the connection back), with no
    # garbage collection: the client's wrapper around the body referred back
    # to the response, a cycle that held the slot until the collector ran
    # (in a long crawl, up to hold_timeout).
    throttle = Throttle(start_delay=0.0, max_concurrency=1, max_wait=5.0)
    async with loopback_hosts(1) as (host,), AsyncThrottledClient(throttle=throttle) as client:
        with collector_off():
            await _give_up(client, host.url("/stream/200/25"), how, closed)
            response = await client.get(host.url("/next"))  # waits for its turn, if held
    assert response.status_code == 200
    assert response.elapsed.total_seconds() > 0  # set through the wrapper's weak reference
    slot = throttle.slot(host.address).snapshot()
    assert (slot.sent, slot.failures) == (2, 0)
    assert_idle(throttle, host.address)


def test_the_sync_clients_body_given_up_half_read_lets_the_next_request_go() -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1, max_wait=5.0)
    with (
        running_hosts(1) as (host,),
        ThrottledClient(throttle=throttle) as client,
        collector_off(),
    ):
        request = client.build_request("GET", host.url("/stream/200/25"))
        response = client.send(request, stream=True)
        for _ in response.iter_bytes():
            break
        del response
        assert client.get(host.url("/next")).status_code == 200
    assert_idle(throttle, host.address)
