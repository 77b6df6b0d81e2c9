"""A user's walk through the aiohttp adapter with the session settings people pass.

Beside ``tests/test_adapters_walk_httpx.py``: a redirect loop, a session with
``base_url``, ``raise_for_status`` and a ``ClientTimeout`` shorter than the
wait for the turn, and a streamed body given up half-read, against real
loopback servers. docs/adapters.md, "With your client's own settings", says
what they found.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import time
from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web

from autothrottle import Throttle, ThrottleTimeout
from autothrottle.aiohttp import ThrottledSession
from helpers import fixed
from loopback import loopback_hosts, served_here


def assert_idle(throttle: Throttle, *keys: str) -> None:
    for key in keys:
        slot = throttle.slot(key)
        assert (slot.in_flight, slot.queued) == (0, 0), key


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """No garbage collection in the block: what is released there was released
    by reference counting, whenever the collector would have run."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_a_redirect_loop_ends_at_max_redirects_each_hop_on_its_own_host() -> None:
    urls: list[str] = []
    arrived: list[str] = []

    async def loop(request: web.Request) -> web.Response:
        here = request.host.rsplit(":", 1)[0]
        arrived.append(here)
        other = next(url for url in urls if f"//{here}:" not in url)
        raise web.HTTPFound(other + "loop")

    app = web.Application()
    app.router.add_get("/loop", loop)
    throttle = Throttle(start_delay=0.0)
    async with (
        served_here(["127.0.0.2", "127.0.0.3"], app) as served,
        ThrottledSession(throttle=throttle) as session,
    ):
        urls.extend(served)
        with pytest.raises(aiohttp.TooManyRedirects):
            await session.get(urls[0] + "loop", max_redirects=4)
    assert arrived == ["127.0.0.2", "127.0.0.3"] * 2
    snapshot = throttle.snapshot()
    for key in ("127.0.0.2", "127.0.0.3"):
        assert (snapshot[key].sent, dict(snapshot[key].status_counts)) == (2, {302: 2})
    assert_idle(throttle, "127.0.0.2", "127.0.0.3")


async def test_a_session_timeout_shorter_than_the_turn_fails_with_aiohttps_own_error() -> None:
    # `total` counts the wait for the turn (the middleware runs under
    # aiohttp's timer): past it aiohttp cancels the wait and raises its plain
    # TimeoutError, which says nothing of the throttle; `max_wait` raises
    # ThrottleTimeout, which names it. Neither counts a failure or holds anything.
    throttle = fixed(30.0)
    async with (
        loopback_hosts(1) as (host,),
        ThrottledSession(
            throttle=throttle,
            base_url=host.origin,
            raise_for_status=True,
            timeout=aiohttp.ClientTimeout(total=0.5),
        ) as session,
    ):
        async with session.get("/first") as response:
            assert await response.text() == "ok"
        started = time.monotonic()
        with pytest.raises(TimeoutError) as raised:
            await session.get("/timed-out")
        assert time.monotonic() - started < 10.0  # the 0.5 s, not the 30-s turn
        assert not isinstance(raised.value, ThrottleTimeout)
        bounded = {"autothrottle": {"max_wait": 0.1}}
        with pytest.raises(ThrottleTimeout) as told:
            await session.get("/bounded", trace_request_ctx=bounded)
        assert told.value.bound == "max_wait"
    assert [a.path for a in host.arrivals] == ["/first"]
    slot = throttle.slot(host.address).snapshot()
    assert (slot.sent, slot.failures) == (1, 0)
    assert_idle(throttle, host.address)


async def test_raise_for_status_raises_after_the_throttle_heard_the_answer() -> None:
    throttle = Throttle(start_delay=0.0)
    async with (
        loopback_hosts(1) as (host,),
        ThrottledSession(throttle=throttle, base_url=host.origin, raise_for_status=True) as session,
    ):
        with pytest.raises(aiohttp.ClientResponseError) as raised:
            await session.get("/status/429?h.Retry-After=3")
    assert raised.value.status == 429
    slot = throttle.slot(host.address).snapshot()
    assert (slot.sent, slot.failures, dict(slot.status_counts)) == (1, 0, {429: 1})
    assert slot.pause_remaining > 1.0  # its Retry-After heard
    assert_idle(throttle, host.address)


@pytest.mark.skipif(
    not hasattr(aiohttp, "DigestAuthMiddleware"), reason="this aiohttp has no DigestAuthMiddleware"
)
async def test_digest_auths_middleware_sends_again_each_send_its_own_turn() -> None:
    # aiohttp's own middleware sends the request, reads the 401 and sends it
    # again: the throttle's middleware, last, paces each send on the wire.
    arrived: list[tuple[float, str]] = []

    async def digest(request: web.Request) -> web.Response:
        answer = request.headers.get("Authorization", "")
        arrived.append((time.monotonic(), answer))
        if answer.startswith("Digest "):
            return web.Response(text="in")
        challenge = 'Digest realm="walk", nonce="n0", qop="auth", opaque="o", algorithm=MD5'
        return web.Response(status=401, headers={"WWW-Authenticate": challenge})

    app = web.Application()
    app.router.add_get("/digest", digest)
    delay = 0.2
    throttle = fixed(delay)
    auth = aiohttp.DigestAuthMiddleware("user", "secret")
    async with (
        served_here(["127.0.0.6"], app) as (url,),
        ThrottledSession(throttle=throttle, middlewares=(auth,)) as session,
    ):
        for _ in range(2):
            async with session.get(url + "digest") as response:
                assert (response.status, await response.text()) == (200, "in")
    assert [bool(answer) for _, answer in arrived] == [False, True, True]
    slot = throttle.slot("127.0.0.6").snapshot()
    assert (slot.sent, dict(slot.status_counts)) == (3, {401: 1, 200: 2})
    times = [at for at, _ in arrived]
    # Stamped by a server on this event loop: late by the loop's lag, never early.
    assert all(b - a >= delay / 2 for a, b in itertools.pairwise(times)), times
    assert_idle(throttle, "127.0.0.6")


async def _give_up(session: aiohttp.ClientSession, url: str, how: str, closed: bool) -> None:
    """Read one chunk of a long body, then stop: by ``break`` or by the reading
    task being cancelled; inside ``async with`` (``closed``) or on a response
    nothing closes."""

    async def read() -> None:
        if closed:
            async with session.get(url) as response:
                async for _ in response.content.iter_chunked(16):
                    if how == "break":
                        break
                    reading.set()
            return
        response = await session.get(url)
        async for _ in response.content.iter_chunked(16):
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


@pytest.mark.parametrize("closed", [True, False], ids=["in-async-with", "never-closed"])
@pytest.mark.parametrize("how", ["break", "cancel"])
async def test_a_body_given_up_half_read_lets_the_next_request_go(how: str, closed: bool) -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1, max_wait=5.0)
    async with loopback_hosts(1) as (host,), ThrottledSession(throttle=throttle) as session:
        with collector_off():
            await _give_up(session, host.url("/stream/200/25"), how, closed)
            async with session.get(host.url("/next")) as response:  # waits for its turn, if held
                assert response.status == 200
    slot = throttle.slot(host.address).snapshot()
    assert (slot.sent, slot.failures) == (2, 0)
    assert_idle(throttle, host.address)
