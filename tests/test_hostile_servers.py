"""Every adapter against a server that misbehaves at the TCP and HTTP level.

A request to a hostile server (:mod:`hostile`: never answers, stalls the body,
closes or resets early, sends a broken status line, 10,000 headers, a 1 MB
header, a 429 with hostile ``Retry-After`` and rate-limit values in every
dialect read, a 100 Continue, a 101 nobody asked for, a redirect to itself, a
chunked body that never ends, HTTP/1.0, a byte a second) must end: with a
response or an error, by the client's own timeouts, or by the caller's
cancel. So must a POST of a few megabytes the server answers before reading
it, leaves an ``Expect: 100-continue`` unanswered, stops reading (the TCP
window fills) or resets partway through, and a streaming upload its caller
cancels. Then, whatever the path:

* the throttle holds nothing for the slot (``in_flight`` 0, nothing queued);
* the next request to the host is granted (its ``max_wait`` is well below
  ``hold_timeout``: a phantom reservation would refuse it, however long the
  machine took);
* the slot's delay stays within ``[min_delay, max_delay]`` and no pause is
  longer than ``max_pause``;
* a hostile value the library reads is named in the log (``docs/signals.md``);
* the slot learns once per request that reached the host (the server
  counts them), in every adapter alike: a response, or the host's failure
  when the host broke the exchange before its headers (``docs/adapters.md``,
  "Failure"); a cancel counts as no failure, nor does the caller's own body
  failing as it is sent;
* nothing is logged at ERROR (a lost task's exception included).

Bounds are generous: a request must end within :data:`ENDS` seconds, whatever
the load; no test asserts speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from autothrottle import SlotSnapshot, Throttle, ThrottleTimeout
from hostile import HOSTILE_VALUES, HostileServer, hostile_server

ADDRESS = "127.0.0.61"
KEY = ADDRESS
MAX_DELAY = 0.5
MAX_PAUSE = 0.25
GRANT = 10.0
"""The follow-up request's ``max_wait``: far above any wait the slot may ask
(``MAX_DELAY``, ``MAX_PAUSE``), far below ``hold_timeout`` (300 s), which is
what a reservation nobody released would hold it for."""
ENDS = 30.0
"""Seconds within which a hostile request must end (it takes about one)."""
STALL_READ = 0.3
"""The client's read timeout for behaviours that stall."""
STALL_TOTAL = 1.0
"""What ends a stalled upload where the client has no write timeout: aiohttp's
``total``, and urllib3's connect timeout, under which it sends the body."""
READ = 20.0
"""The client's read timeout for the others: it never fires."""

STALLS = ("silent", "stall-body", "chunked-stall", "slowloris")
"""Behaviours only a timeout or a cancel ends."""
QUIET = (*STALLS, "upgrade")
"""Behaviours that may go quiet: the client's read timeout is short."""
ANSWERED = {"http10": 200, "continue": 200, **{f"429-{kind}": 429 for kind in HOSTILE_VALUES}}
"""Behaviours every client must read as a response, with its status."""
BEHAVIOURS = (
    *STALLS,
    "short-body",
    "reset-before",
    "reset-after",
    "bad-status",
    "garbage",
    "bad-header",
    "many-headers",
    "huge-header",
    "chunked-drip",
    "upgrade",
    "redirect-loop",
    *ANSWERED,
)
LOGGED = {
    "429-garbage": (logging.INFO, "soon-ish"),
    "429-huge": (logging.WARNING, "capped to max_pause"),
    "429-negative": (logging.INFO, "-86400"),
    "429-far-date": (logging.WARNING, "capped to max_pause"),
    "429-overlong": (logging.INFO, "5000 characters long"),
}
"""What the log must say of each hostile 429: its level and a piece of its text."""

ASYNC_ADAPTERS = ("aiohttp", "httpx-async", "httpx2-async")
ADAPTERS = (*ASYNC_ADAPTERS, "httpx-sync", "httpx2-sync", "requests")
UNFIT = {("requests", "upgrade")}
"""Pairs left out, each for its client's own reason: urllib3 reads a 101 nobody
asked for as a response without a body and puts its connection back in the
pool, where the next request waits on a server that switched protocols."""
CASES = [(a, b) for a in ADAPTERS for b in BEHAVIOURS if (a, b) not in UNFIT]


@pytest.fixture(scope="module")
def server() -> Iterator[HostileServer]:
    with hostile_server(ADDRESS) as running:
        yield running


def throttle() -> Throttle:
    """A cap of one: a reservation left behind would refuse the next request.
    A short delay: each hop of a redirect loop (20 to 30) waits it."""
    return Throttle(start_delay=0.005, max_delay=MAX_DELAY, max_concurrency=1, max_pause=MAX_PAUSE)


# -- one client per adapter, behind one small interface --------------------------------
#
# Each opener yields ``get(url, read, max_wait, partial) -> status``: a GET that
# reads the body (only its first piece, then closes, when ``partial``), with
# ``read`` as the client's read timeout (None: the client's defaults) and
# ``max_wait`` as the request's option (None: none); and ``post(url, body,
# stall, expect) -> status``: a POST of ``body`` (bytes, or a function making
# an async iterator of them: a streaming upload), with ``stall`` as every
# timeout of the client's that ends a stalled upload or answer (None: none
# fires), and ``Expect: 100-continue`` sent when ``expect``.

_AsyncGet = Callable[[str, float | None, float | None, bool], Awaitable[int]]
_SyncGet = Callable[[str, float | None, float | None, bool], int]
_Body = bytes | Callable[[], AsyncIterator[bytes]]
_SyncBody = bytes | Callable[[], Iterator[bytes]]
_AsyncPost = Callable[[str, _Body, float | None, bool], Awaitable[int]]
_SyncPost = Callable[[str, _SyncBody, float | None, bool], int]
EXPECT = {"Expect": "100-continue"}


@dataclass
class AsyncClient:
    get: _AsyncGet
    post: _AsyncPost


@dataclass
class SyncClient:
    get: _SyncGet
    post: _SyncPost


@contextlib.asynccontextmanager
async def _aiohttp(limiter: Throttle) -> AsyncIterator[AsyncClient]:
    import aiohttp

    from autothrottle.aiohttp import ThrottledSession

    async with ThrottledSession(throttle=limiter) as session:

        async def get(url: str, read: float | None, max_wait: float | None, partial: bool) -> int:
            kwargs: dict[str, Any] = {}
            if read is not None:
                kwargs["timeout"] = aiohttp.ClientTimeout(sock_read=read, sock_connect=READ)
            if max_wait is not None:
                kwargs["trace_request_ctx"] = {"autothrottle": {"max_wait": max_wait}}
            async with session.get(url, **kwargs) as response:
                await (response.content.readany() if partial else response.read())
                return response.status

        async def post(url: str, body: _Body, stall: float | None, expect: bool) -> int:
            # aiohttp has no write timeout, and starts its read timeout once the
            # body is sent: only ``total`` ends an upload that stalls.
            timeout = aiohttp.ClientTimeout(
                total=None if stall is None else STALL_TOTAL,
                sock_read=stall or READ,
                sock_connect=READ,
            )
            data = body if isinstance(body, bytes) else body()
            async with session.post(url, data=data, expect100=expect, timeout=timeout) as response:
                await response.read()
                return response.status

        yield AsyncClient(get, post)


PLAIN_HTTP = False
"""httpx's ``verify`` for a client of the hostile server, which speaks plain
HTTP: no certificates loaded (certifi's cost 50 ms of CPU a client)."""


def _httpx_async(
    package: str,
) -> Callable[[Throttle], contextlib.AbstractAsyncContextManager[AsyncClient]]:
    @contextlib.asynccontextmanager
    async def opener(limiter: Throttle) -> AsyncIterator[AsyncClient]:
        client_package = pytest.importorskip(package)
        adapter = pytest.importorskip(f"autothrottle.{package}")
        async with adapter.AsyncThrottledClient(
            throttle=limiter, follow_redirects=True, verify=PLAIN_HTTP
        ) as client:

            async def get(
                url: str, read: float | None, max_wait: float | None, partial: bool
            ) -> int:
                kwargs: dict[str, Any] = {}
                if read is not None:
                    kwargs["timeout"] = client_package.Timeout(READ, read=read)
                if max_wait is not None:
                    kwargs["extensions"] = {"autothrottle": {"max_wait": max_wait}}
                async with client.stream("GET", url, **kwargs) as response:
                    if partial:
                        async for _ in response.aiter_raw():
                            break
                    else:
                        await response.aread()
                    return int(response.status_code)

            async def post(url: str, body: _Body, stall: float | None, expect: bool) -> int:
                timeout = client_package.Timeout(READ, read=stall or READ, write=stall or READ)
                content = body if isinstance(body, bytes) else body()
                headers = EXPECT if expect else None
                async with client.stream(
                    "POST", url, content=content, headers=headers, timeout=timeout
                ) as response:
                    await response.aread()
                    return int(response.status_code)

            yield AsyncClient(get, post)

    return opener


def _httpx_sync(
    package: str,
) -> Callable[[Throttle], contextlib.AbstractContextManager[SyncClient]]:
    @contextlib.contextmanager
    def opener(limiter: Throttle) -> Iterator[SyncClient]:
        client_package = pytest.importorskip(package)
        adapter = pytest.importorskip(f"autothrottle.{package}")
        with adapter.ThrottledClient(
            throttle=limiter, follow_redirects=True, verify=PLAIN_HTTP
        ) as client:

            def get(url: str, read: float | None, max_wait: float | None, partial: bool) -> int:
                kwargs: dict[str, Any] = {}
                if read is not None:
                    kwargs["timeout"] = client_package.Timeout(READ, read=read)
                if max_wait is not None:
                    kwargs["extensions"] = {"autothrottle": {"max_wait": max_wait}}
                with client.stream("GET", url, **kwargs) as response:
                    if partial:
                        for _ in response.iter_raw():
                            break
                    else:
                        response.read()
                    return int(response.status_code)

            def post(url: str, body: _SyncBody, stall: float | None, expect: bool) -> int:
                timeout = client_package.Timeout(READ, read=stall or READ, write=stall or READ)
                content = body if isinstance(body, bytes) else body()
                headers = EXPECT if expect else None
                with client.stream(
                    "POST", url, content=content, headers=headers, timeout=timeout
                ) as response:
                    response.read()
                    return int(response.status_code)

            yield SyncClient(get, post)

    return opener


@contextlib.contextmanager
def _requests(limiter: Throttle) -> Iterator[SyncClient]:
    pytest.importorskip("requests")
    from autothrottle.requests import ThrottledSession

    with ThrottledSession(throttle=limiter) as session:

        def get(url: str, read: float | None, max_wait: float | None, partial: bool) -> int:
            kwargs: dict[str, Any] = {"timeout": (READ, read)}
            if max_wait is not None:
                kwargs["autothrottle"] = {"max_wait": max_wait}
            with session.get(url, stream=True, **kwargs) as response:
                if partial:
                    next(response.iter_content(1), None)
                else:
                    _ = response.content
                return int(response.status_code)

        def post(url: str, body: _SyncBody, stall: float | None, expect: bool) -> int:
            # urllib3 sends the body under the connect timeout, and reads under the read one.
            timeout = (READ, READ) if stall is None else (STALL_TOTAL, stall)
            data = body if isinstance(body, bytes) else body()
            headers = EXPECT if expect else None
            with session.post(url, data=data, headers=headers, timeout=timeout) as response:
                return int(response.status_code)

        yield SyncClient(get, post)


OPENERS: dict[str, Any] = {
    "aiohttp": _aiohttp,
    "httpx-async": _httpx_async("httpx"),
    "httpx2-async": _httpx_async("httpx2"),
    "httpx-sync": _httpx_sync("httpx"),
    "httpx2-sync": _httpx_sync("httpx2"),
    "requests": _requests,
}


# -- one run: the hostile request, the slot left, the next request ---------------------


@dataclass
class Run:
    outcome: int | BaseException
    took: float
    left: SlotSnapshot
    follow_up: int | BaseException
    arrivals: int = 0


def _idle(limiter: Throttle) -> bool:
    slot = limiter.snapshot().get(KEY)
    return slot is None or (slot.in_flight, slot.queued) == (0, 0)


async def _run_async(
    adapter: str,
    send: Callable[[AsyncClient], Awaitable[int]],
    ok: str,
    cancel: float | None = None,
) -> tuple[Run, Throttle]:
    limiter = throttle()
    async with OPENERS[adapter](limiter) as client:
        started = time.monotonic()
        outcome: int | BaseException
        try:
            request = send(client)
            outcome = await (request if cancel is None else asyncio.wait_for(request, cancel))
        except Exception as error:
            outcome = error
        took = time.monotonic() - started
        for _ in range(int(10 / 0.01)):  # the lease's linger: a release may come soon, not now
            if _idle(limiter):
                break
            await asyncio.sleep(0.01)
        left = limiter.snapshot()[KEY]
        try:
            follow_up: int | BaseException = await client.get(ok, READ, GRANT, False)
        except Exception as error:
            follow_up = error
    return Run(outcome, took, left, follow_up), limiter


def _run_sync(adapter: str, send: Callable[[SyncClient], int], ok: str) -> tuple[Run, Throttle]:
    limiter = throttle()
    with OPENERS[adapter](limiter) as client:
        started = time.monotonic()
        outcome: int | BaseException
        try:
            outcome = send(client)
        except Exception as error:
            outcome = error
        took = time.monotonic() - started
        for _ in range(int(10 / 0.01)):
            if _idle(limiter):
                break
            time.sleep(0.01)
        left = limiter.snapshot()[KEY]
        try:
            follow_up: int | BaseException = client.get(ok, READ, GRANT, False)
        except Exception as error:
            follow_up = error
    return Run(outcome, took, left, follow_up), limiter


def _check(run: Run, behaviour: str) -> None:
    """What every run must leave, whatever the adapter and however it ended."""
    assert run.took < ENDS, f"the request took {run.took:.1f} s to end"
    left = run.left
    assert (left.in_flight, left.queued) == (0, 0), f"the slot still holds {left}"
    assert not isinstance(run.follow_up, ThrottleTimeout), (
        f"the next request was refused its turn: the slot held a phantom reservation ({left})"
    )
    assert run.follow_up == 200, f"the next request failed: {run.follow_up!r}"
    assert 0.0 <= left.delay <= MAX_DELAY, left
    assert left.pause_remaining <= MAX_PAUSE, left


@pytest.mark.parametrize(("adapter", "behaviour"), CASES)
def test_a_hostile_server_leaves_nothing_held(
    adapter: str, behaviour: str, server: HostileServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="autothrottle")
    read = STALL_READ if behaviour in QUIET else READ
    partial = behaviour == "chunked-drip"  # no read timeout ends it: the caller stops reading
    url, ok = server.url(behaviour), server.url("ok")
    if adapter in ASYNC_ADAPTERS:
        run, _ = asyncio.run(_run_async(adapter, lambda c: c.get(url, read, None, partial), ok))
    else:
        run, _ = _run_sync(adapter, lambda c: c.get(url, read, None, partial), ok)
    run.arrivals = server.arrivals(url)
    _check(run, behaviour)
    if behaviour in ANSWERED:
        assert run.outcome == ANSWERED[behaviour], run.outcome
    elif behaviour in STALLS:
        assert isinstance(run.outcome, Exception), run.outcome
    # One lesson per request that reached the host, in every adapter alike: a
    # response (its body may break after the headers) or, when the host broke
    # the exchange before its headers, the host's failure. aiohttp resends an
    # idempotent request once on a reset: two sends, two lessons.
    left = run.left
    assert run.arrivals >= 1
    assert left.responses + left.failures == run.arrivals, (run.outcome, left)
    if behaviour in LOGGED:
        level, text = LOGGED[behaviour]
        said = [r for r in caplog.records if r.levelno >= level and text in r.getMessage()]
        assert said, [r.getMessage() for r in caplog.records]
    _no_error_logged(caplog, collect=False)


@pytest.mark.parametrize("behaviour", (*STALLS, "chunked-drip"))
@pytest.mark.parametrize("adapter", ASYNC_ADAPTERS)
def test_a_cancelled_request_to_a_hostile_server_leaves_nothing_held(
    adapter: str, behaviour: str, server: HostileServer
) -> None:
    """No client timeout: the caller's ``asyncio.wait_for`` ends the request."""
    url, ok = server.url(behaviour), server.url("ok")
    run, _ = asyncio.run(
        _run_async(adapter, lambda c: c.get(url, None, None, False), ok, STALL_READ)
    )
    run.arrivals = server.arrivals(url)
    _check(run, behaviour)
    assert isinstance(run.outcome, TimeoutError), run.outcome
    assert run.left.failures == 0, run.left  # a cancel is the caller's, never the host's


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_bound_the_caller_set_holds_against_a_hostile_pause(
    adapter: str, server: HostileServer
) -> None:
    """A ``Retry-After`` of 10**400 seconds pauses the slot for ``max_pause``
    (its 300 s here); a request bounded by ``max_wait`` fails at its bound with
    the adapter's ``ThrottleTimeout``, sends nothing and leaves nothing held."""
    limiter = Throttle(start_delay=0.05, max_concurrency=1)
    refused, ok = server.url("429-huge"), server.url("ok")
    bound = 0.3

    def check(first: int, second: int | BaseException, took: float) -> None:
        assert first == 429
        assert isinstance(second, ThrottleTimeout), second
        assert took < ENDS, f"a request bounded by {bound} s took {took:.1f} s"
        left = limiter.snapshot()[KEY]
        assert (left.in_flight, left.queued, left.sent) == (0, 0, 1), left
        assert 0.0 < left.pause_remaining <= limiter.max_pause, left
        assert server.arrivals(ok) == 0

    if adapter in ASYNC_ADAPTERS:

        async def run() -> None:
            async with OPENERS[adapter](limiter) as client:
                first = await client.get(refused, READ, None, False)
                started = time.monotonic()
                second: int | BaseException
                try:
                    second = await client.get(ok, READ, bound, False)
                except Exception as error:
                    second = error
                check(first, second, time.monotonic() - started)

        asyncio.run(run())
    else:
        with OPENERS[adapter](limiter) as client:
            first = client.get(refused, READ, None, False)
            started = time.monotonic()
            second: int | BaseException
            try:
                second = client.get(ok, READ, bound, False)
            except Exception as error:
                second = error
            check(first, second, time.monotonic() - started)


@pytest.mark.parametrize("behaviour", ("bad-status", "many-headers", "huge-header"))
def test_aiohttp_counts_a_response_its_parser_refused_as_the_hosts_failure(
    behaviour: str, server: HostileServer
) -> None:
    """aiohttp raises ``ClientResponseError`` for a head it refuses, where httpx
    raises ``RemoteProtocolError`` and requests a ``ConnectionError``: the host
    broke the protocol, and the slot backs off (it once only released)."""
    pytest.importorskip("aiohttp")

    async def run() -> SlotSnapshot:
        limiter = throttle()
        async with OPENERS["aiohttp"](limiter) as client:
            with pytest.raises(Exception) as raised:
                await client.get(server.url(behaviour), READ, None, False)
        assert type(raised.value).__name__ == "ClientResponseError"
        return limiter.snapshot()[KEY]

    left = asyncio.run(run())
    assert (left.failures, left.backoffs, left.in_flight) == (1, 1, 0), left
    assert left.last_backoff_reason == "failure: ClientResponseError"


# -- the request body's side --------------------------------------------------------------

UPLOAD = b"u" * (2 << 20)
"""A 2 MB body."""
STALLED_UPLOAD = b"s" * (16 << 20)
"""16 MB: past what the client's send buffer (4 MB) and the server's window hold
together, so a server that stops reading stalls the client's writes."""


@dataclass(frozen=True)
class Upload:
    behaviour: str
    body: bytes
    outcome: int | type[Exception] | None
    """The status every client reads, or an error every client raises; None:
    either, as the client goes (one reads the early answer, one fails its write)."""
    expect: bool = False
    """The client sends ``Expect: 100-continue``."""
    stalls: bool = False
    """The client's timeouts are short: nothing but them ends it for some client."""


UPLOADS = {
    "refuse-close": Upload("refuse-close", UPLOAD, None),
    "refuse-close-midway": Upload("refuse-close", STALLED_UPLOAD, None),
    "refuse-keep": Upload("refuse-keep", UPLOAD, 413),
    "refuse-hold": Upload("refuse-hold", STALLED_UPLOAD, None, stalls=True),
    "expect-unanswered": Upload("silent", UPLOAD, Exception, expect=True, stalls=True),
    "expect-refused": Upload("refuse-keep", UPLOAD, 413, expect=True),
    "expect-refused-close": Upload("refuse-close", UPLOAD, None, expect=True),
    "stop-reading": Upload("stop-reading", STALLED_UPLOAD, Exception, stalls=True),
    "reset-upload": Upload("reset-upload", UPLOAD, Exception),
}
"""Each upload case: the server's behaviour, the body, and how it ends.
``refuse-close`` answers before the 2 MB are read, which the client's and the
server's buffers take whole; ``-midway``, while the client still writes."""


def _no_error_logged(caplog: pytest.LogCaptureFixture, *, collect: bool = True) -> None:
    """Nothing at ERROR, from the library or from asyncio (a task's exception
    never retrieved, a callback that raised): every case here is handled.
    asyncio logs a lost task's exception when the task is collected, hence
    ``collect`` (30 ms a test: the many GET cases check without it)."""
    if collect:
        gc.collect()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [(r.name, r.getMessage()) for r in errors]


@pytest.mark.parametrize("case", UPLOADS)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_an_upload_to_a_hostile_server_leaves_nothing_held(
    adapter: str, case: str, server: HostileServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A POST whose body the server answers before reading (then closes,
    reads it after, or never reads it), answers with no 100 to an ``Expect:
    100-continue`` (or not at all), stops reading (the window fills), or
    resets partway through, ends by a response or the client's own timeouts,
    holds nothing after, and teaches the slot once."""
    upload = UPLOADS[case]
    url, ok = server.url(upload.behaviour), server.url("ok")
    stall = STALL_READ if upload.stalls else None
    if adapter in ASYNC_ADAPTERS:

        def send_async(client: AsyncClient) -> Awaitable[int]:
            return client.post(url, upload.body, stall, upload.expect)

        run, _ = asyncio.run(_run_async(adapter, send_async, ok))
    else:
        run, _ = _run_sync(
            adapter, lambda client: client.post(url, upload.body, stall, upload.expect), ok
        )
    run.arrivals = server.arrivals(url)
    _check(run, case)
    if isinstance(upload.outcome, int):
        assert run.outcome == upload.outcome, run.outcome
    elif upload.outcome is not None:
        assert isinstance(run.outcome, upload.outcome), run.outcome
    # One lesson: the response, or the host's failure (every error here is the
    # host's: a reset, a timeout); no client resends a POST.
    answered = isinstance(run.outcome, int)
    left = run.left
    assert run.arrivals == 1
    assert (left.responses, left.failures) == (int(answered), int(not answered)), (
        run.outcome,
        left,
    )
    _no_error_logged(caplog)


async def _stalling_upload() -> AsyncIterator[bytes]:
    """A streaming body whose producer sends 512 KB, then waits for ever."""
    for _ in range(8):
        yield b"p" * 65536
    await asyncio.Event().wait()


async def _endless_upload() -> AsyncIterator[bytes]:
    """A streaming body that never ends (well past any window: 1 GB)."""
    chunk = b"e" * 65536
    for _ in range(1 << 14):
        yield chunk


CANCELLED: dict[str, tuple[str, _Body, bool]] = {
    "producer-waits": ("silent", _stalling_upload, False),
    "window-full": ("stop-reading", _endless_upload, False),
    "waits-for-100": ("silent", UPLOAD, True),
}
"""Where an upload is when its caller cancels it: a streaming body waiting for
its producer, or for the server's window (``/stop-reading``); a body waiting
for a 100 that never comes (aiohttp; the others send it at once)."""


@pytest.mark.parametrize("case", CANCELLED)
@pytest.mark.parametrize("adapter", ASYNC_ADAPTERS)
def test_an_upload_cancelled_by_its_caller_leaves_nothing_held(
    adapter: str, case: str, server: HostileServer, caplog: pytest.LogCaptureFixture
) -> None:
    """No client timeout: the caller's ``asyncio.wait_for`` cancels the upload
    midway; the cancel is the caller's, never the host's failure."""
    behaviour, body, expect = CANCELLED[case]
    url, ok = server.url(behaviour), server.url("ok")

    def send(client: AsyncClient) -> Awaitable[int]:
        return client.post(url, body, None, expect)

    run, _ = asyncio.run(_run_async(adapter, send, ok, STALL_READ))
    run.arrivals = server.arrivals(url)
    _check(run, case)
    assert isinstance(run.outcome, TimeoutError), run.outcome
    assert run.arrivals == 1
    assert (run.left.failures, run.left.responses) == (0, 0), run.left
    _no_error_logged(caplog)


class ProducerFailed(Exception):
    """The caller's body producer failed: nothing of the host's."""


async def _failing_upload() -> AsyncIterator[bytes]:
    for _ in range(4):
        yield b"f" * 65536
    raise ProducerFailed


def _failing_upload_sync() -> Iterator[bytes]:
    for _ in range(4):
        yield b"f" * 65536
    raise ProducerFailed


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_an_upload_whose_producer_fails_is_the_callers_error(
    adapter: str, server: HostileServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A streaming body that raises midway fails the request with the caller's
    error (aiohttp wraps it in a ``ClientConnectionError`` whose cause it is):
    the slot releases, as it does for every client, and never backs off."""
    url, ok = server.url("silent"), server.url("ok")
    if adapter in ASYNC_ADAPTERS:

        def send_async(client: AsyncClient) -> Awaitable[int]:
            return client.post(url, _failing_upload, None, False)

        run, _ = asyncio.run(_run_async(adapter, send_async, ok))
    else:
        run, _ = _run_sync(
            adapter, lambda client: client.post(url, _failing_upload_sync, None, False), ok
        )
    _check(run, "silent")
    error = run.outcome
    assert isinstance(error, Exception), error
    assert isinstance(error, ProducerFailed) or isinstance(error.__cause__, ProducerFailed), error
    left = run.left
    assert (left.failures, left.backoffs, left.responses) == (0, 0, 0), left
    _no_error_logged(caplog)
