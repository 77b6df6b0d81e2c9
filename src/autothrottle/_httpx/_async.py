"""The async httpx adapter: :class:`AsyncThrottledTransport` and :class:`AsyncThrottledClient`.

Written once, in ``_httpx/_async.py``: the sync adapter (``_httpx/_sync.py``)
and the httpx2 adapter are generated from it by ``scripts/unasync.py``. A
line whose sync form differs says so in a trailing ``# unasync:`` comment
(the sync line's code, or ``-`` to leave it out).
"""

from __future__ import annotations

import copy
import inspect  # unasync: -
import logging
import weakref
from collections.abc import (
    AsyncIterator,
    Awaitable,  # unasync: -
    Callable,
    Coroutine,  # unasync: -
    Mapping,
    Sequence,
)
from time import monotonic, perf_counter
from types import TracebackType
from typing import Any, Self, Unpack, cast

import httpx

from .._errors import ThrottleTimeout
from .._exchange import Exchange, Plug, paced
from .._extras import require_privates
from .._hold import release_later
from .._lease import Lease
from .._throttle import Throttle, check_throttle, throttle_hint
from .._validate import keywords_only
from ._common import (
    COMPLETE,
    FAILED,
    STARTED,
    STREAM_REFERS_BACK,
    ClientOptions,
    DefaultTimeout,
    cache_outside,
    check_control_header,
    from_cache,
    host_failure,
    prepare,
    timed_out,
    unconnected,
)
from ._pools import (
    Openings,
    Passing,
    PooledOrigin,
    Pools,
    Serial,
    Serials,
    check_pool_per_host,
    http2,
    pools_for,
)

__all__ = ["AsyncThrottledClient", "AsyncThrottledTransport"]

logger = logging.getLogger("autothrottle")


_UserTrace = Callable[[str, dict[str, Any]], object]


class _AsyncClientOptions(ClientOptions, total=False):
    mounts: Mapping[str, httpx.AsyncBaseTransport | None] | None
    transport: httpx.AsyncBaseTransport | None


async def _call_user(user: _UserTrace, name: str, info: dict[str, Any]) -> None:
    """The user's own ``trace`` callback, awaited when the async client's is a coroutine."""
    result = user(name, info)  # unasync: user(name, info)
    if inspect.isawaitable(result):  # unasync: -
        await result  # unasync: -


class _Tracer:
    """httpcore ``trace`` callback: takes the wire turn and times the request.

    It calls the user's own callback first. Each event overwrites the previous
    one of its kind, so when several requests share the trace (an HTTPS
    proxy's ``CONNECT``, a retry on a fresh connection) the last, real one is
    timed; the wire turn is taken once, at the first.
    """

    __slots__ = ("closing", "end", "entry", "exchange", "saved", "serial", "user")

    #: Set by a plug over the pools per origin (:meth:`_HttpxPlug.wire`) only.
    entry: PooledOrigin
    closing: Sequence[Any]

    def __init__(self, exchange: Exchange, user: object, saved: dict[str, Any]) -> None:
        self.exchange = exchange
        self.user = user
        self.end: float | None = None
        self.saved = saved  # the request's own extensions, put back after sending
        #: An HTTP/2 pool's origin, held until on the wire (or a learned one's watch).
        self.serial: Serial | Passing | None = None

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name.endswith(COMPLETE):
            # Before the user's callback: its run time is not the server's.
            self.end = perf_counter()
        elif name.endswith(FAILED):  # before the user's callback, which may not return
            _ended_unsent(self.exchange, info)
        if self.user is not None:
            await _call_user(cast(_UserTrace, self.user), name, info)
        if name.endswith(STARTED):
            # After the user's callback: the headers go out only now.
            await self.exchange.on_wire()
            self.end = None
            if self.serial is not None:
                _on_the_wire(self, name, info)


class _WireTracer:
    """httpcore ``trace`` callback for a request with none of the caller's own.

    It takes the wire turn when the request's headers are about to go out,
    then takes itself off the request (the ``extensions`` of the request
    httpcore sends, the dict it reads): httpcore stops emitting events, each
    of which costs an awaited call. The latency then ends when httpcore hands
    the response back, as it does under aiohttp. Through an HTTPS proxy it
    stays for the tunnel's ``CONNECT`` and leaves at the real request, whose
    sending starts the latency.

    It keeps no reference to those extensions, which refer to it: a cycle
    there would keep the request's exchange and lease for the collector to
    find, where reference counting frees them when the request is done.
    """

    __slots__ = ("closing", "entry", "exchange", "saved", "serial")

    end = None  # never timed here: the response's return is
    #: Set by a plug over the pools per origin (:meth:`_HttpxPlug.wire`) only.
    entry: PooledOrigin
    closing: Sequence[Any]

    def __init__(self, exchange: Exchange, saved: dict[str, Any]) -> None:
        self.exchange = exchange
        self.saved = saved  # the request's own extensions, put back after sending
        #: An HTTP/2 pool's origin, held until on the wire (or a learned one's watch).
        self.serial: Serial | Passing | None = None

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name.endswith(STARTED):
            exchange = self.exchange
            wait = exchange.wire_now()
            if wait > 0.0:
                await exchange.on_wire(wait)
            request = info.get("request")
            if request is not None and request.method != b"CONNECT":
                request.extensions.pop("trace", None)
            if self.serial is not None:
                _on_the_wire(self, name, info)
        elif name.endswith(FAILED):  # a connect, a TLS handshake: before the headers
            _ended_unsent(self.exchange, info)


def _ended_unsent(exchange: Exchange, info: dict[str, Any]) -> None:
    """A step of httpcore's raised before the request's wire turn (its
    connection being made: TCP, TLS, a proxy's tunnel, a retry's sleep):
    cancelled (or interrupted), the request never reached its host, and a
    fleet's turn it holds goes back whole (``Exchange.unconnected``). An error
    only says so once it ends the request (httpcore retries a failed connect):
    ``Exchange.failed`` asks the plug's :func:`~._common.unconnected` then."""
    if not isinstance(info.get("exception"), Exception):
        exchange.unconnected()


def _on_the_wire(wiring: _Tracer | _WireTracer, name: str, info: dict[str, Any]) -> None:
    """The request's headers go out (not a proxy's ``CONNECT``): the next
    request of its origin may be handed over (:class:`~._pools.Serial`), and
    the event's name says the connection's protocol (``http11.`` or ``http2.``),
    which a learned origin's request passing straight tells its origin's
    :class:`~._pools.Passing`."""
    request = info.get("request")
    if request is not None and request.method == b"CONNECT":
        return  # the tunnel's: the request itself is still to go
    serial = wiring.serial
    if serial is not None:
        wiring.serial = None
        serial.leave(not name.startswith("http11."))


async def _send_in_turn(
    serials: Serials, send: _Send, request: httpx.Request, wiring: _Tracer | _WireTracer
) -> httpx.Response:
    """Hand ``request`` over to an HTTP/2 pool once the request of its origin
    before it has its headers out (:class:`~._pools.Serial`)."""
    url = request.url
    try:
        serial = await serials.enter(url)  # unasync: serial = serials.enter_blocking(url)
    except BaseException:  # never handed over: nothing of it went
        wiring.exchange.unconnected()
        raise
    wiring.serial = serial
    try:
        response = await send(request)
    except BaseException:
        if wiring.serial is not None:  # failed or cancelled before its headers went out
            wiring.serial = None
            serial.leave()
        raise
    else:
        if wiring.serial is not None:  # answered with no trace event: not httpcore's pool
            wiring.serial = None
            serial.leave(False)
        return response
    finally:
        serials.done(serial)


class _LeaseStream(httpx.AsyncByteStream):
    """A response body that holds its request's lease until it is closed.

    httpx closes a response's stream itself when its body has been read to
    the end (``aread``, ``aiter_bytes`` and the like), and when reading it
    fails for a request not streamed; a streamed one is closed by its
    ``async with`` (or ``aclose``). So the close is the end: the body's
    chunks pass straight from the inner stream, with no call of this one's
    per chunk.

    The stream is the hold itself: a response garbage-collected unclosed
    takes this stream with it, whose finalizer releases the lease, soon
    rather than at once (the collector may have run inside the gate's lock:
    ``_hold.release_later``). A finalizer of our own class costs a
    request one call when the stream is freed, where a weak reference to it
    (``_hold.watch``, for clients whose response is not ours to extend)
    cost the making of the reference, the loop's look-up and two set updates.

    httpx's client wraps this stream in one that refers back to the response
    (``STREAM_REFERS_BACK``), a cycle that only the garbage collector frees:
    as the body is first read (or the response closed unread), the wrapper's
    reference becomes a weak one (:func:`_unbind`). A response then dropped
    unclosed (a ``break`` out of its body, its task cancelled, no ``async
    with``) is freed with the last reference to it, once httpx's iterators of
    its body are closed (as httpx's own pool gets its connection back), and
    its lease is released with it: not at the collector's next full run,
    which in a long crawl may be minutes away, up to ``hold_timeout``.
    """

    __slots__ = ("_inner", "_lease", "_response")

    def __init__(
        self, inner: httpx.AsyncByteStream, lease: Lease, response: httpx.Response | None = None
    ) -> None:
        self._inner = inner
        self._lease: Lease | None = lease
        # A weak reference: a response this transport answered directly (no
        # client's wrapper around the stream) must not be in a cycle with it.
        self._response: weakref.ref[httpx.Response] | None = (
            weakref.ref(response) if response is not None and STREAM_REFERS_BACK else None
        )

    def __aiter__(self) -> AsyncIterator[bytes]:
        held = self._response
        if held is not None:  # _unbind, inline: the usual response's body passes here
            self._response = None
            response = held()
            if response is not None:
                wrapper: Any = response.stream
                try:  # an attribute read; getattr's default would cost a call
                    refers_back = wrapper._response is response  # noqa: SLF001
                except AttributeError:  # not the client's wrapper: left as it is
                    refers_back = False
                if refers_back:
                    wrapper._response = _PROXY(response)  # noqa: SLF001
        return self._inner.__aiter__()  # unasync: return iter(self._inner)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            # After the inner close, so the connection is back in the pool
            # before the next request of the slot may go.
            lease = self._lease  # released once
            if lease is not None:
                self._lease = None
                lease.release()
            held = self._response
            if held is not None:  # closed before its body was read
                self._response = None
                _unbind(held)

    def __del__(self) -> None:
        lease = self._lease
        if lease is not None:  # collected unclosed: released soon, on this thread's loop
            self._lease = None
            release_later(lease)


def _unbind(held: weakref.ref[httpx.Response]) -> None:
    """Leave the client's wrapper around a throttled response's stream a weak
    reference to the response in place of its own (:class:`_LeaseStream`): the
    wrapper only sets the response's ``elapsed`` as it closes, and without the
    cycle the response, its request and all they hold are freed when the
    caller lets go of the response, the lease with them."""
    response = held()
    if response is None:
        return
    wrapper: Any = response.stream
    try:  # an attribute read; getattr's default would cost a call
        refers_back = wrapper._response is response  # noqa: SLF001
    except AttributeError:  # not the client's wrapper: left as it is
        return
    if refers_back:
        wrapper._response = _PROXY(response)  # noqa: SLF001


class _Wired(_LeaseStream):
    """The wiring of a request sent on its origin's idle connection, with no
    trace; then its response's body (:meth:`_HttpxPlug.respond`).

    A request whose grant kept no gap after the slot's previous one (a slot
    paced by its cap alone, or within a burst), to a pool per origin whose
    last request went less than ``Pools.RECENT`` ago and which has an idle
    connection, is sent on that connection at once: the connection is ready
    when the request is handed over, so the wire turn is taken then
    (:meth:`_PoolPerOrigin.send`) and the latency counts from there, and
    httpcore emits no event (each an awaited call). A spaced grant is traced
    still: httpcore's locks yield to the event loop between the hand-over
    and the headers, and on a busy loop that lag would shorten the gap the
    host sees. If the server closed the idle connection after all, httpcore
    opens another, and the connect counts in that request's latency.

    One object for the request, from its wiring to its body's close: the
    usual request makes no second one for its body.
    """

    __slots__ = ("closing", "entry", "exchange", "saved")

    end = None  # never timed here: the response's return is

    #: The longest wait for the wire turn (seconds) a request still spends
    #: before it is sent on the idle connection: a turn granted early by the
    #: lead (rule 10), whose connection stays recent and idle meanwhile. One
    #: that waits longer is traced, as a request on a new connection is.
    SOON = 0.05

    def __init__(  # no call of the stream's own: it holds nothing until the response
        self, saved: dict[str, Any], entry: PooledOrigin, closing: Sequence[Any], exchange: Exchange
    ) -> None:
        self.saved = saved  # the request's own extensions, put back after sending
        self.entry = entry
        self.closing = closing
        self.exchange = exchange
        self._lease = None  # nothing held yet: a failed request is released by the skeleton


_WIRING = "autothrottle.wiring"
"""Where a request sent through the sync client's pools per origin carries its
wiring, for ``_PoolPerOrigin.send``: an attribute of the request object (its
``__dict__``), as threads may send at once. The async client's pools keep it
themselves (``_PoolPerOrigin.wired``): reading the ``__dict__`` of an object
that keeps its attributes inline makes a dict of them."""


_Wiring = _Tracer | _WireTracer | _Wired
_WEAK = weakref.ref
_PROXY = weakref.proxy
_Sent = Awaitable[httpx.Response]  # unasync: _Sent = httpx.Response
_Send = Callable[[httpx.Request], _Sent]


class _HttpxPlug(Plug[httpx.Request, httpx.Response, _Wiring]):
    """How httpx sends and reads, for the request skeleton (``_exchange.paced``).

    ``client``: the transport is a throttled client's own, which marks httpx's
    default timeout on its requests (``_common.DefaultTimeout``). ``origins``:
    the transport sends through a pool per origin, which the plug takes for
    each request when its turn comes and gives back when it is sent.
    ``httpcore``: the transport is httpx's own (the pools per origin are),
    whose httpcore pool writes nothing of a request before its
    ``send_request_headers`` trace event, where the wire turn is taken.
    """

    __slots__ = ("client", "httpcore", "origins", "send")

    def __init__(
        self, client: bool, origins: _PoolPerOrigin | None = None, httpcore: bool = False
    ) -> None:
        self.client = client
        self.origins = origins
        self.httpcore = httpcore or origins is not None
        #: How the request is handed over: the pools' own, made once (its
        #: bound method), or None for the inner transport's.
        self.send: _Send | None = None if origins is None else origins.send

    def host_failure(self, error: BaseException) -> bool:
        return host_failure(error)

    def unconnected(self, error: BaseException) -> bool:
        if isinstance(error, Exception):
            return unconnected(error)
        # Cancelled before its wire turn: through httpx's own transport, httpcore
        # wrote nothing of it, wherever it was (connecting, or queued in its pool
        # for a connection, a wait it reports no event for).
        return self.httpcore

    def timed_out(self, error: ThrottleTimeout, request: httpx.Request) -> BaseException:
        return timed_out(error, request, self.client)

    def wire(self, exchange: Exchange, request: httpx.Request) -> _Wiring:
        origins = self.origins
        # The trace goes on a copy of the extensions, restored after sending: the
        # client copies them into redirect hops, which must not inherit this one's.
        extensions = request.extensions
        user = extensions.get("trace")
        if origins is None:
            if user is None:
                wired = _WireTracer(exchange, extensions)
                request.extensions = {**extensions, "trace": wired}
                return wired
            tracer = _Tracer(exchange, user, extensions)
            request.extensions = {**extensions, "trace": tracer}
            return tracer
        # First, so that nothing is to undo if it fails (making a pool may: the
        # skeleton then releases the lease). The lease's slot: its pace says how
        # long to keep the origin's pool.
        lease = exchange.lease
        entry, closing, recent = origins.pools.lend_unlocked(request.url, monotonic(), lease)
        wiring: _Wiring
        if (
            recent
            and user is None
            and lease.wire_gap == 0.0  # no spacing for the wire turn to keep
            and origins.serials is None  # HTTP/2: the trace's turn keeps streams in order
            and not entry.opens_connection()
        ):
            wiring = _Wired(extensions, entry, closing, exchange)
            origins.wired = wiring  # unasync: request.__dict__[_WIRING] = wiring
            return wiring
        if user is None:
            wiring = _WireTracer(exchange, extensions)
        else:
            wiring = _Tracer(exchange, user, extensions)
        request.extensions = {**extensions, "trace": wiring}
        origins.wired = wiring  # unasync: request.__dict__[_WIRING] = wiring
        wiring.entry = entry
        wiring.closing = closing
        return wiring

    def unwire(self, request: httpx.Request, wiring: _Wiring) -> None:
        request.extensions = wiring.saved
        if self.origins is not None:
            # Pools.done, without its call (no lock to take)  # unasync: -
            wiring.entry.sending -= 1  # unasync: self.origins.pools.done(wiring.entry)

    def respond(
        self, exchange: Exchange, response: httpx.Response, wiring: _Wiring
    ) -> httpx.Response:
        extensions = response.extensions
        if "caching" in extensions or "from_cache" in extensions:  # hishel's marks
            cached = from_cache(extensions)
            status, headers = response.status_code, response.headers
            exchange.responded(status, headers, wiring.end, from_cache=cached)
        else:  # the usual response: no keyword, no call
            exchange.responded(response.status_code, response.headers, wiring.end)
        if self.origins is not None:
            # httpcore's own dict, made for this response alone (by the pool
            # per origin, httpx's own transport): no copy needed.
            extensions["autothrottle"] = exchange.info()
        else:  # the inner transport's response, whose dict may be shared: a copy
            response.extensions = {**extensions, "autothrottle": exchange.info()}
        stream: httpx.AsyncByteStream = response.stream  # type: ignore[assignment]
        if response.is_closed:  # the inner transport already read the body
            exchange.lease.release()
        elif type(wiring) is _Wired:  # the usual: the wiring becomes the body
            # It holds the lease from now until the body is closed (set here,
            # without a call: the usual request's one path).
            wiring._inner = stream  # noqa: SLF001
            wiring._lease = exchange.lease  # noqa: SLF001
            # Weakly, as _LeaseStream's: the client's wrapper refers back to it.
            wiring._response = _WEAK(response) if STREAM_REFERS_BACK else None  # noqa: SLF001
            response.stream = wiring
        else:
            response.stream = _LeaseStream(stream, exchange.lease, response)
        return response

    async def aclose(self, response: httpx.Response) -> None:
        await response.aclose()


_PLUG = _HttpxPlug(client=False)
_CLIENTS_PLUG = _HttpxPlug(client=True)
_HTTPCORE_PLUG = _HttpxPlug(client=False, httpcore=True)
_CLIENTS_HTTPCORE_PLUG = _HttpxPlug(client=True, httpcore=True)


def _plug_for(inner: httpx.AsyncBaseTransport, client: bool) -> _HttpxPlug:
    """The plug of a throttled transport over ``inner``: one that knows it is
    httpx's own (exactly: a subclass may send as it likes) or one that does not."""
    if type(inner) is httpx.AsyncHTTPTransport:
        return _CLIENTS_HTTPCORE_PLUG if client else _HTTPCORE_PLUG
    return _CLIENTS_PLUG if client else _PLUG


@keywords_only(throttle_hint)
class AsyncThrottledTransport(httpx.AsyncBaseTransport):
    """An httpx transport that paces the requests of ``inner`` with ``throttle``.

    Args:
        inner: The transport that does the sending; default a new
            ``httpx.AsyncHTTPTransport()``. Closing this transport closes it.
        throttle: The engine that decides when each request may go. One
            throttle may serve many transports and clients; they share slots.

    Raises:
        TypeError: ``inner`` is not an ``httpx.AsyncBaseTransport`` or
            ``throttle`` is not a :class:`~autothrottle.Throttle`.

    Example::

        throttle = Throttle(start_delay=1.0, max_delay=30.0)
        transport = AsyncThrottledTransport(httpx.AsyncHTTPTransport(retries=2), throttle=throttle)
        async with httpx.AsyncClient(transport=transport) as client:
            await client.get("https://example.com/a")
            await client.get("https://example.com/b")  # ~1 s later
            await client.get(
                "https://example.com/health",
                extensions={"autothrottle": {"bypass": True}},  # not paced
            )

    Note that ``httpx.AsyncClient(transport=...)`` ignores environment proxies
    and that ``mounts=`` bypass ``transport=``; use :class:`AsyncThrottledClient`
    to keep both throttled.
    """

    def __init__(
        self, inner: httpx.AsyncBaseTransport | None = None, *, throttle: Throttle
    ) -> None:
        self._throttle = check_throttle(throttle, type(self).__name__)
        if inner is None:
            inner = httpx.AsyncHTTPTransport()
        elif not isinstance(inner, httpx.AsyncBaseTransport):
            raise TypeError(f"inner must be an httpx.AsyncBaseTransport, got {inner!r}")
        self._inner = inner
        self._plug = _plug_for(inner, client=False)
        #: HTTP/2 on, or not known to be off: an origin's requests are handed
        #: over one at a time (``Serial``), until it is learned to speak HTTP/1.1.
        protocol = http2(inner)
        self._serials = None if protocol is False else Serials(learn=protocol is None)

    @property
    def inner(self) -> httpx.AsyncBaseTransport:
        """The wrapped transport."""
        return self._inner

    @property
    def throttle(self) -> Throttle:
        """The throttle that paces this transport's requests."""
        return self._throttle

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r}, throttle={self._throttle!r})"

    def handle_async_request(
        self, request: httpx.Request
    ) -> Coroutine[Any, Any, httpx.Response]:  # unasync: ) -> httpx.Response:
        """Wait for the slot's turn, send through ``inner``, and track the response."""
        # Not a coroutine of its own: the skeleton's is what httpx awaits.  # unasync: -
        plug = self._plug
        send, key, options, bound = prepare(self._throttle, request, plug.client)
        if key is None:
            return self._inner.handle_async_request(send)
        inner = plug.send
        if inner is None:  # looked up now: a mock may patch the inner transport's class
            inner = self._inner.handle_async_request if self._serials is None else self._in_turn
        return paced(plug, self._throttle, key, options, bound, inner, send)

    def _in_turn(self, request: httpx.Request) -> _Sent:
        """Send through an HTTP/2 ``inner`` (or one not known to be HTTP/1.1) in the
        origin's turn (:func:`_send_in_turn`), unless the origin was learned to
        speak HTTP/1.1 (``Serials.passing``)."""
        serials = self._serials
        assert serials is not None
        wiring = request.extensions["trace"]  # the plug's, for every throttled request here
        passing = serials.passing(request.url)
        if passing is not None:
            wiring.serial = passing  # on HTTP/2 after all, the origin is forgotten
            return self._inner.handle_async_request(request)
        return _send_in_turn(serials, self._inner.handle_async_request, request, wiring)

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self._inner.__aexit__(exc_type, exc_value, traceback)


class _PoolPerOrigin(httpx.AsyncBaseTransport):
    """One of httpx's own transports per origin, each closed once idle past ``pools.expiry``.

    httpcore's single pool walks every connection on every request and asks
    each idle one whether its socket was closed (a system call): a throttled
    crawl of many hosts keeps hundreds idle between sends and spends its CPU
    there (``docs/adapters.md``, "Many hosts"). A pool per origin stays small.

    A throttled request does not pass through this transport's own
    coroutine: its plug takes the origin's pool when the turn comes
    (:meth:`_HttpxPlug.wire`) and :meth:`send` hands the request to that
    pool, so no frame of this class is resumed at each of httpcore's awaits.
    :meth:`handle_async_request` serves the requests sent unthrottled.
    """

    def __init__(self, pools: Pools, serials: Serials | None = None) -> None:
        self.pools = pools
        self.openings = Openings()
        #: HTTP/2 on: an origin's requests are handed over one at a time (``Serial``).
        self.serials = serials
        #: The wiring of the request being handed over (from the plug's wire
        #: to send, which the skeleton calls next, with no await between):
        #: one event loop's thread sends through these pools, so one at a time.
        self.wired: Any = None  # a _Wiring while handed over  # unasync: -

    def send(
        self, request: httpx.Request
    ) -> Awaitable[httpx.Response]:  # unasync: ) -> httpx.Response:
        """Send a throttled request through the pool its plug took for it."""
        wiring: _Wiring = self.wired  # unasync: wiring: _Wiring = request.__dict__.pop(_WIRING)
        self.wired = None  # unasync: -
        entry = wiring.entry
        if type(wiring) is _Wired:
            exchange = wiring.exchange
            wait = exchange.wire_now()  # the wire turn, taken now if it is free
            if wait > 0.0:
                if wait <= _Wired.SOON:
                    return self._send_wired(wiring, request, wait)
                # A long wait: traced, so the turn is taken when the headers go
                # (on a copy of the extensions, which unwire puts back).
                tracer = _WireTracer(exchange, wiring.saved)
                request.extensions = {**request.extensions, "trace": tracer}
                return self._send_slowly(entry, request, wiring.closing)
            if wiring.closing:
                return self._send_slowly(entry, request, wiring.closing)
        elif self.serials is not None:
            closing = wiring.closing
            return _send_in_turn(
                self.serials,
                lambda sent: self._send_slowly(entry, sent, closing),
                request,
                cast("_Tracer | _WireTracer", wiring),
            )
        elif wiring.closing or entry.opens_connection():
            return self._send_slowly(entry, request, wiring.closing)
        pool: httpx.AsyncBaseTransport = entry.pool
        return pool.handle_async_request(request)

    async def _send_wired(
        self, wiring: _Wired, request: httpx.Request, wait: float
    ) -> httpx.Response:
        """Send ``request`` on its origin's idle connection once its wire turn has come."""
        await wiring.exchange.on_wire(wait)
        return await self._send_slowly(wiring.entry, request, wiring.closing)

    async def _send_slowly(
        self, entry: PooledOrigin, request: httpx.Request, closing: Sequence[Any]
    ) -> httpx.Response:
        """Send ``request`` through ``entry``'s pool, waiting for a turn to open
        a connection if it opens one, then close the ``closing`` pools."""
        pool: httpx.AsyncBaseTransport = entry.pool
        try:
            if entry.opens_connection():
                openings = self.openings
                try:
                    await openings.enter(request)  # unasync: openings.enter_blocking(request)
                except BaseException:  # given up, or past the pool timeout: never sent
                    wiring = request.extensions.get("trace")
                    if isinstance(wiring, (_Tracer, _WireTracer)):
                        wiring.exchange.unconnected()
                    raise
                try:
                    return await pool.handle_async_request(request)
                finally:
                    openings.leave()  # unasync: openings.leave_blocking()
            return await pool.handle_async_request(request)
        finally:
            for idle in closing:
                try:
                    await idle.aclose()
                except Exception:  # an idle pool of another origin: not this request's error
                    logger.debug("closing an idle connection pool failed", exc_info=True)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send an unthrottled request (bypassed, or with no host) through its origin's pool."""
        pools = self.pools
        entry, closing = pools.take(request.url, monotonic())
        try:
            return await self._send_slowly(entry, request, closing)
        finally:
            pools.done(entry)

    async def aclose(self) -> None:
        for pool in self.pools.clear():
            await pool.aclose()


#: httpx's private names the adapter is built on (``tests/test_privates.py``):
#: checked here, at import, so that a release without one fails before a crawl.
PRIVATES = ("AsyncClient._transport_for_url",)
require_privates(httpx, PRIVATES)

#: httpx's own, to tell when a mock patched it on the class.
_TRANSPORT_FOR_URL = httpx.AsyncClient._transport_for_url  # noqa: SLF001
_HTTPX_CLIENT = httpx.AsyncClient  # read at each request: a mock patches the class


@keywords_only(throttle_hint)
class AsyncThrottledClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` whose every route is throttled.

    It takes the same arguments as ``httpx.AsyncClient`` plus ``throttle``, and
    wraps in an :class:`AsyncThrottledTransport` every transport the client uses:

    * the default transport, or the one given as ``transport=``;
    * proxy transports, from ``proxy=`` or from the environment
      (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY`` keep working
      as in httpx when ``trust_env`` is true and no ``transport=`` is given);
    * every transport given in ``mounts=``.

    A transport that already is an :class:`AsyncThrottledTransport` is used as is.
    Requests through a proxy are keyed by their target host, not the proxy's.

    Its default transport keeps one connection pool per origin, made with the
    client's own settings (one SSL context for all) on the origin's first
    request and closed once idle for ``limits.keepalive_expiry`` (when httpx
    would no longer reuse its connections anyway): httpcore's single pool
    costs CPU that grows with the square of its idle connections, and a
    throttled crawl of many hosts keeps many idle (``docs/adapters.md``).
    ``limits`` then apply per origin. ``pool_per_host=False`` keeps httpx's
    single pool.

    Args:
        throttle: The engine that paces the requests.
        pool_per_host: One connection pool per origin (the default, unless
            you give a ``transport=``) or one for all (False).
        **kwargs: Passed to ``httpx.AsyncClient``.

    Raises:
        TypeError: ``throttle`` is not a :class:`~autothrottle.Throttle`.
        ValueError: ``pool_per_host=True`` with a ``transport=`` of your own
            (the pools are httpx's own transport, made per origin).

    Example::

        throttle = Throttle(start_delay=0.5)
        async with AsyncThrottledClient(
            throttle=throttle,
            follow_redirects=True,
            mounts={"https://api.example.com": httpx.AsyncHTTPTransport(retries=3)},
        ) as client:
            await client.get("https://api.example.com/items")  # throttled too
    """

    def __init__(
        self,
        *,
        throttle: Throttle,
        pool_per_host: bool | None = None,
        **kwargs: Unpack[_AsyncClientOptions],
    ) -> None:
        # Set before httpx builds its transports, which goes through _wrap.
        self._throttle = check_throttle(throttle, type(self).__name__)
        self._pool_per_host = check_pool_per_host(pool_per_host, kwargs.get("transport"))
        super().__init__(**kwargs)
        if "timeout" not in kwargs:  # httpx's default: marked, so it bounds no turn
            self._timeout = DefaultTimeout(self._timeout)
        # httpx adds user mounts as given, without a hook: wrap them here.
        self._mounts = {
            pattern: None if transport is None else self._wrap(transport)
            for pattern, transport in self._mounts.items()
        }

    @property
    def throttle(self) -> Throttle:
        """The throttle that paces this client's requests."""
        return self._throttle

    def build_request(self, *args: Any, **kwargs: Any) -> httpx.Request:
        """httpx's, with a bad ``X-AutoThrottle`` header refused here, as the
        request is built, rather than when it is sent: an SDK that retries
        whatever ``send`` raises would retry the mistake as a connection error."""
        request = super().build_request(*args, **kwargs)
        check_control_header(request)
        return request

    def _wrap(self, transport: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
        if isinstance(transport, AsyncThrottledTransport):
            if transport._plug.client:  # noqa: SLF001 (this module's own class)
                return transport
            # Given as is: a copy (same inner transport, same throttle) that knows
            # this client marks httpx's default timeout, so a timeout equal to it
            # that the user chose still bounds the turn. The user's own transport
            # is left as it was, for a plain client that may share it.
            own = copy.copy(transport)
            own._plug = _plug_for(transport._inner, client=True)  # noqa: SLF001 (its own class)
            return own
        cache = cache_outside(transport, self._wrap)
        if cache is not None:
            return cast(httpx.AsyncBaseTransport, cache)
        throttled = AsyncThrottledTransport(transport, throttle=self._throttle)
        plug = _plug_for(transport, client=True)
        if type(transport) is _PoolPerOrigin:  # the plug takes each request's pool
            plug = _HttpxPlug(client=True, origins=transport)
        throttled._plug = plug  # noqa: SLF001 (this module's own class)
        return throttled

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx.AsyncBaseTransport:
        make = super()._init_transport
        threads = False  # unasync: threads = True
        per_host = self._pool_per_host
        pools = None if args else pools_for(self._throttle, make, per_host, kwargs, threads)
        if pools is None:
            return self._wrap(make(*args, **kwargs))
        serials = Serials() if kwargs.get("http2") else None
        return self._wrap(_PoolPerOrigin(pools, serials))

    def _init_proxy_transport(self, *args: Any, **kwargs: Any) -> httpx.AsyncBaseTransport:
        return self._wrap(super()._init_proxy_transport(*args, **kwargs))

    def _transport_for_url(self, url: httpx.URL) -> httpx.AsyncBaseTransport:
        # Every route is wrapped already; this catches a transport swapped in
        # per request by a patch of httpx.AsyncClient (respx's "httpx" mocker).
        transport = self._transport  # httpx's own answer with no mount, without its call
        if self._mounts or _HTTPX_CLIENT._transport_for_url is not _TRANSPORT_FOR_URL:  # noqa: SLF001
            transport = super()._transport_for_url(url)
        if type(transport) is AsyncThrottledTransport:  # the usual: no call to _wrap
            return transport
        return self._wrap(transport)
