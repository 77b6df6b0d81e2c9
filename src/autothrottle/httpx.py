"""Throttle an ``httpx.AsyncClient``: a transport wrapper and a client subclass.

Every request that goes through :class:`AsyncThrottledTransport` waits for its
slot's turn (per host by default), counts as in flight until its response body
has been read or the response closed, and teaches the slot its latency::

    import httpx
    from autothrottle import Throttle
    from autothrottle.httpx import AsyncThrottledTransport

    throttle = Throttle(target_concurrency=2.0)
    transport = AsyncThrottledTransport(throttle=throttle)
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.get("https://example.com/")

Passing ``transport=`` to ``httpx.AsyncClient`` has two side effects in httpx
itself: the client stops reading proxies from the environment (``HTTP_PROXY``
and friends), and requests routed through ``mounts=`` (or ``proxy=``) skip that
transport, so they would not be throttled. :class:`AsyncThrottledClient` avoids
both: it is an ``httpx.AsyncClient`` that wraps every transport it builds or
is given (the default one, proxy transports from the environment or from
``proxy=``, every ``mounts=`` transport, and ``transport=``)::

    from autothrottle.httpx import AsyncThrottledClient

    async with AsyncThrottledClient(throttle=throttle, mounts={...}) as client:
        ...  # env proxies still apply; every route is throttled

How the adapter behaves:

* **Per-request options**: ``extensions={"autothrottle": {...}}`` (keys
  ``adjust``, ``bypass``, ``slot``) and the header ``X-AutoThrottle:
  no-adjust | bypass | slot=NAME``; the header is removed before the request
  is sent. Malformed options raise ``TypeError``/``ValueError`` before anything
  is sent or held.
* **Latency** is measured from httpcore's ``trace`` events: from
  ``send_request_headers.started`` (a connection is ready, new or taken from the
  pool) to ``receive_response_headers.complete``, so time spent waiting in the
  throttle or in httpx's connection pool does not count. A ``trace`` callback
  you set yourself is still called with the same arguments. Inner transports
  that emit no trace events (mocks) fall back to the time the inner transport
  took to return the response.
* **In flight** lasts until the body is fully read or the response is closed.
  A response that is never closed is released when it is garbage-collected,
  and in any case after the throttle's ``hold_timeout`` (300 s by default).
* **Errors** (refused connection, httpx timeouts, ...) release the slot and
  count as a failure; **cancellation** releases it and counts nothing.
* **Redirects** are followed by the client, which calls the transport once per
  hop, so every hop waits on its own host's slot. Per-request options (the
  extension and the header) apply to every hop.
* **Mocks**: under ``respx.mock`` in either mode (``using="httpcore"``, the
  default, replaces httpcore's pool; ``using="httpx"`` swaps the client's
  transport per request, which :class:`AsyncThrottledClient` wraps too) and with
  ``httpx.MockTransport`` as ``inner``, requests are still paced and counted;
  latency is the fallback above. A plain ``httpx.AsyncClient(transport=
  AsyncThrottledTransport(...))`` under ``using="httpx"`` is not paced: respx
  replaces the transport itself; use :class:`AsyncThrottledClient`.
* **What the throttle did** is on ``response.extensions["autothrottle"]``: a
  :class:`~autothrottle.ThrottleInfo` (slot, seconds waited, grant time,
  whether it adjusts).

For threads, :class:`ThrottledTransport` and :class:`ThrottledClient`
do the same for ``httpx.Client``, on the same engine: threads of one process,
and async clients, share slots when they share the throttle.
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from time import perf_counter
from types import TracebackType
from typing import Any, TypedDict, TypeVar, Unpack, cast

import httpx
from httpx._types import (
    AuthTypes,
    CertTypes,
    CookieTypes,
    HeaderTypes,
    ProxyTypes,
    QueryParamTypes,
    TimeoutTypes,
)

from ._errors import ThrottleTimeout
from ._exchange import Exchange
from ._lease import Lease
from ._request import CONTROL_HEADER, RequestOptions, options_from_header, options_from_mapping
from ._throttle import Throttle

__all__ = [
    "AsyncThrottledClient",
    "AsyncThrottledTransport",
    "ThrottlePoolTimeout",
    "ThrottledClient",
    "ThrottledTransport",
]

_T = TypeVar("_T", bound="AsyncThrottledTransport")
_S = TypeVar("_S", bound="ThrottledTransport")

_STARTED = ".send_request_headers.started"
_COMPLETE = ".receive_response_headers.complete"

_Schedule = Callable[[Callable[[], None]], object]


class _ClientOptions(TypedDict, total=False):
    """``httpx.Client`` and ``httpx.AsyncClient`` keyword arguments, so that
    type checkers and IDEs see them through the throttled clients."""

    auth: AuthTypes | None
    params: QueryParamTypes | None
    headers: HeaderTypes | None
    cookies: CookieTypes | None
    verify: ssl.SSLContext | str | bool
    cert: CertTypes | None
    http1: bool
    http2: bool
    proxy: ProxyTypes | None
    timeout: TimeoutTypes
    follow_redirects: bool
    limits: httpx.Limits
    max_redirects: int
    event_hooks: Mapping[str, list[Callable[..., Any]]] | None
    base_url: httpx.URL | str
    trust_env: bool
    default_encoding: str | Callable[[bytes], str]


class _AsyncClientOptions(_ClientOptions, total=False):
    mounts: Mapping[str, httpx.AsyncBaseTransport | None] | None
    transport: httpx.AsyncBaseTransport | None


class _SyncClientOptions(_ClientOptions, total=False):
    mounts: Mapping[str, httpx.BaseTransport | None] | None
    transport: httpx.BaseTransport | None


def _host_failure(error: BaseException) -> bool:
    """The host failed: it refused, reset, timed out or broke the protocol.

    A pool timeout is this client's own congestion, and the other transport
    errors (an unsupported scheme, a malformed request) are the caller's.
    """
    if isinstance(error, httpx.PoolTimeout):
        return False
    return isinstance(
        error,
        (
            httpx.TimeoutException,
            httpx.NetworkError,
            httpx.RemoteProtocolError,
            httpx.ProxyError,
            OSError,
            TimeoutError,
        ),
    )


class _Tracer:
    """httpcore ``trace`` callback: takes the wire turn and times the request.

    It calls the user's own callback first. Each event overwrites the previous
    one of its kind, so when several requests share the trace (an HTTPS
    proxy's ``CONNECT``, a retry on a fresh connection) the last, real one is
    timed; the wire turn is taken once, at the first.
    """

    __slots__ = ("end", "exchange", "user")

    def __init__(self, exchange: Exchange, user: object) -> None:
        self.exchange = exchange
        self.user = user
        self.end: float | None = None

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name.endswith(_COMPLETE):
            # Before the user's callback: its run time is not the server's.
            self.end = perf_counter()
        user = self.user
        if user is not None:
            result = cast(Callable[[str, dict[str, Any]], object], user)(name, info)
            if inspect.isawaitable(result):
                await result
        if name.endswith(_STARTED):
            # After the user's callback: the headers go out only now.
            await self.exchange.on_wire()
            self.end = None


class _SyncTracer(_Tracer):
    """:class:`_Tracer` for the sync client: httpcore calls it synchronously."""

    __slots__ = ()

    def __call__(self, name: str, info: dict[str, Any]) -> None:  # type: ignore[override]
        if name.endswith(_COMPLETE):
            self.end = perf_counter()
        if self.user is not None:
            cast(Callable[[str, dict[str, Any]], object], self.user)(name, info)
        if name.endswith(_STARTED):
            self.exchange.on_wire_blocking()
            self.end = None


def _scheduler() -> _Schedule | None:
    """A thread-safe way to run a callback soon on the current event loop."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        pass
    trio: Any = sys.modules.get("trio")
    if trio is not None:
        try:
            return cast(_Schedule, trio.lowlevel.current_trio_token().run_sync_soon)
        except RuntimeError:
            pass
    return None


def _release_collected(lease: Lease, schedule: _Schedule | None) -> None:
    """Release the lease of a response that was garbage-collected unclosed.

    The garbage collector may run in the middle of the slot's own bookkeeping,
    so the release is deferred to the event loop rather than done in place
    (the gate's lock makes an in-place release safe in a thread).
    """
    if lease.released:
        return
    if schedule is not None:
        try:
            schedule(lease.release)
            return
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass
    lease.release()


class _Releaser:
    """Releases a lease once the body is finished, closed or collected."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._finalizer = weakref.finalize(self, _release_collected, lease, _scheduler())
        self._finalizer.atexit = False

    def _release(self) -> None:
        self._finalizer.detach()
        self._lease.release()


class _LeaseStream(_Releaser, httpx.AsyncByteStream):
    """A response body that releases its request's lease once finished.

    Finished means: iterated to the end (or failed while iterating), closed,
    or garbage-collected without either.
    """

    def __init__(self, inner: httpx.AsyncByteStream, lease: Lease) -> None:
        super().__init__(lease)
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        finally:
            self._release()

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            # After the inner close, so the connection is back in the pool
            # before the next request of the slot may go.
            self._release()


class _SyncLeaseStream(_Releaser, httpx.SyncByteStream):
    """:class:`_LeaseStream` for the sync client."""

    def __init__(self, inner: httpx.SyncByteStream, lease: Lease) -> None:
        super().__init__(lease)
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        finally:
            self._release()

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._release()


def _without_control_header(request: httpx.Request) -> httpx.Request:
    """A copy of ``request`` to send, minus the control header.

    A copy rather than an edit: the client builds redirect hops from the
    original, and they must carry the same options.
    """
    headers = httpx.Headers(request.headers)
    del headers[CONTROL_HEADER]
    return httpx.Request(
        request.method,
        request.url,
        headers=headers,
        stream=request.stream,
        extensions=request.extensions,
    )


def _prepare(
    throttle: Throttle, request: httpx.Request
) -> tuple[httpx.Request, str | None, RequestOptions]:
    """The request to send, its slot key (None: do not throttle it) and its options.

    A request with no host is not throttled: the inner transport refuses it
    with httpx's own error (``UnsupportedProtocol``), as a plain client would.
    """
    options = options_from_mapping(request.extensions)
    header = request.headers.get(CONTROL_HEADER)
    send = request
    if header is not None:
        options = options.merged(options_from_header(header))
        send = _without_control_header(request)
    if options.bypass:
        return send, None, options
    if options.slot is not None:
        return send, options.slot, options
    host = request.url.host
    if not host:
        return send, None, options
    return send, throttle.key_for(request.url, host=host), options


class ThrottlePoolTimeout(ThrottleTimeout, httpx.PoolTimeout):
    """The wait for the turn outlasted its bound: both the library's
    :class:`~autothrottle.ThrottleTimeout` and httpx's ``PoolTimeout`` (a
    ``TimeoutException``), so either ``except`` catches it. Nothing was sent.

    Its ``bound`` says which setting was reached: ``"max_wait"`` or
    ``"httpx pool timeout"`` (one you set; httpx's default never bounds the turn).
    """

    def __init__(self, error: ThrottleTimeout, request: httpx.Request) -> None:
        ThrottleTimeout.__init__(self, error.slot, error.waited, error.bound)
        self._request = request


#: Put on each request by the throttled clients: whether its pool timeout is
#: one the user set (on the client or the request) rather than httpx's default.
_POOL_TIMEOUT_SET = "autothrottle.pool_timeout_set"
_HTTPX_DEFAULT_TIMEOUT = httpx.Timeout(5.0).as_dict()


def _timeout_is_set(kwargs: Mapping[str, Any], client_timeout_set: bool) -> bool:
    """Whether a request built with ``build_request(**kwargs)`` carries a timeout
    the user chose: per request, in its extensions, or on the client."""
    if kwargs.get("timeout", httpx.USE_CLIENT_DEFAULT) is not httpx.USE_CLIENT_DEFAULT:
        return True
    extensions = kwargs.get("extensions")
    return client_timeout_set or (isinstance(extensions, Mapping) and "timeout" in extensions)


def _pool_bound(extensions: Mapping[str, Any]) -> float | None:
    """httpx's pool timeout of a request when the user set it, else None.

    Waiting for the turn is waiting to send, as waiting for the pool is, so a
    pool timeout the user chose bounds it. httpx's default (5 s, on every
    client that was given none) does not: a wait the user did not bound must
    not fail. The throttled clients mark each request; for a plain
    ``httpx.AsyncClient`` around a transport, a timeout equal to httpx's
    default counts as the default.
    """
    timeout = extensions.get("timeout")
    pool = timeout.get("pool") if isinstance(timeout, dict) else None
    if not isinstance(pool, (int, float)):
        return None
    chosen = extensions.get(_POOL_TIMEOUT_SET)
    if chosen is None:
        chosen = timeout != _HTTPX_DEFAULT_TIMEOUT
    return float(pool) if chosen else None


def _wait_bound(
    request: httpx.Request, options: RequestOptions
) -> tuple[float | None, float | None]:
    """The bound on the wait for the turn, and the pool timeout among it:
    the request's ``max_wait`` option, or a pool timeout the user set if shorter."""
    pool = _pool_bound(request.extensions)
    bounds = [b for b in (pool, options.max_wait) if b is not None]
    return (min(bounds) if bounds else None), pool


def _timed_out(
    error: ThrottleTimeout, request: httpx.Request, pool: float | None
) -> ThrottlePoolTimeout:
    if pool is not None and error.waited == pool:
        error = ThrottleTimeout(error.slot, error.waited, "httpx pool timeout")
    return ThrottlePoolTimeout(error, request)


def _from_cache(extensions: Mapping[str, Any]) -> bool:
    """Whether hishel answered from its cache: ``extensions["from_cache"]``
    (hishel 0.x) or ``extensions["caching"]["from_cache"]`` (hishel 1 and 2)."""
    if extensions.get("from_cache") is True:
        return True
    caching = extensions.get("caching")
    return isinstance(caching, Mapping) and caching.get("from_cache") is True


def _cache_outside(transport: Any, wrap: Callable[[Any], Any]) -> Any | None:
    """A hishel cache transport with the throttle moved inside it, or None.

    A cache hit must neither wait for the host's turn nor teach the slot; with
    the cache outside the throttle it never reaches it (``docs/compose.md``).
    """
    if type(transport).__module__.startswith("hishel") and hasattr(transport, "next_transport"):
        transport.next_transport = wrap(transport.next_transport)
        return transport
    return None


def _tracked(response: httpx.Response, exchange: Exchange, stream: Any) -> httpx.Response:
    """``response`` with what the throttle did on it, holding the lease until its
    body is finished (``stream``: the async or sync lease stream)."""
    response.extensions = {**response.extensions, "autothrottle": exchange.info()}
    if response.is_closed:  # the inner transport already read the body
        exchange.lease.release()
    else:
        response.stream = stream(response.stream, exchange.lease)
    return response


def _traced(send: httpx.Request, tracer: _Tracer) -> dict[str, Any]:
    """Put ``tracer`` on ``send``; return the extensions to restore after sending.

    The client copies these extensions into redirect hops: they must not
    inherit this hop's tracer.
    """
    extensions = send.extensions
    send.extensions = {**extensions, "trace": tracer}
    return extensions


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
        transport = AsyncThrottledTransport(
            httpx.AsyncHTTPTransport(retries=2, http2=True), throttle=throttle
        )
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
        if not isinstance(throttle, Throttle):
            raise TypeError(f"throttle must be an autothrottle.Throttle, got {throttle!r}")
        if inner is None:
            inner = httpx.AsyncHTTPTransport()
        elif not isinstance(inner, httpx.AsyncBaseTransport):
            raise TypeError(f"inner must be an httpx.AsyncBaseTransport, got {inner!r}")
        self._inner = inner
        self._throttle = throttle

    @property
    def inner(self) -> httpx.AsyncBaseTransport:
        """The wrapped transport."""
        return self._inner

    @property
    def throttle(self) -> Throttle:
        """The throttle that paces this transport's requests."""
        return self._throttle

    def __repr__(self) -> str:
        return f"AsyncThrottledTransport({self._inner!r}, throttle={self._throttle!r})"

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Wait for the slot's turn, send through ``inner``, and track the response."""
        send, key, options = _prepare(self._throttle, request)
        if key is None:
            return await self._inner.handle_async_request(send)
        asked, (bound, pool) = perf_counter(), _wait_bound(send, options)
        try:
            lease = await self._throttle.acquire(key, adjust=options.adjust, max_wait=bound)
        except ThrottleTimeout as error:
            raise _timed_out(error, request, pool) from error
        exchange = Exchange(lease, asked)
        tracer = _Tracer(exchange, send.extensions.get("trace"))
        extensions = _traced(send, tracer)
        try:
            response = await self._inner.handle_async_request(send)
        except BaseException as error:
            exchange.failed(error, _host_failure)
            raise
        finally:
            send.extensions = extensions
        try:
            exchange.responded(
                response.status_code,
                response.headers,
                tracer.end,
                from_cache=_from_cache(response.extensions),
            )
        except BaseException:
            await response.aclose()
            raise
        return _tracked(response, exchange, _LeaseStream)

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._inner.aclose()

    async def __aenter__(self: _T) -> _T:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self._inner.__aexit__(exc_type, exc_value, traceback)


class _PoolPerHost(httpx.AsyncBaseTransport):
    """One inner transport per origin, made by ``factory`` on first use.

    httpcore's pool walks every connection it holds on every request, and for
    each idle one counts all of them again (encode/httpcore#1035); a
    throttled crawl of many hosts keeps hundreds idle between sends, and the
    client spends its CPU there (docs/benchmarks.md, many_hosts). A pool per
    origin stays small.
    """

    def __init__(self, factory: Callable[[], httpx.AsyncBaseTransport]) -> None:
        self._factory = factory
        self._pools: dict[tuple[str, str, int | None], httpx.AsyncBaseTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = (url.scheme, url.host, url.port)
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = self._factory()
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        pools = list(self._pools.values())
        self._pools.clear()
        for pool in pools:
            await pool.aclose()


class _SyncPoolPerHost(httpx.BaseTransport):
    """:class:`_PoolPerHost` for threads: one pool per origin, made under a lock."""

    def __init__(self, factory: Callable[[], httpx.BaseTransport]) -> None:
        self._factory = factory
        self._pools: dict[tuple[str, str, int | None], httpx.BaseTransport] = {}
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = (url.scheme, url.host, url.port)
        with self._lock:
            pool = self._pools.get(origin)
            if pool is None:
                pool = self._pools[origin] = self._factory()
        return pool.handle_request(request)

    def close(self) -> None:
        with self._lock:
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.close()


def _check_pool_per_host(pool_per_host: object, transport: object) -> None:
    if not isinstance(pool_per_host, bool):
        raise TypeError(f"pool_per_host must be a bool, got {pool_per_host!r}")
    if pool_per_host and transport is not None:
        raise ValueError(
            "pool_per_host=True makes httpx's own transport per host; "
            f"it cannot be combined with transport={transport!r}"
        )


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

    ``pool_per_host=True`` gives each origin its own connection pool (made
    with the client's own settings on its first request), for a crawl of
    many hosts: httpcore's single pool costs CPU that grows with the square
    of its idle connections, and a throttled crawl of 200 hosts spent a whole
    core there for 66 requests a second (`docs/benchmarks.md`, many_hosts).
    ``limits`` then apply per host.

    Args:
        throttle: The engine that paces the requests.
        pool_per_host: One connection pool per origin (default: one pool).
        **kwargs: Passed to ``httpx.AsyncClient``.

    Raises:
        TypeError: ``throttle`` is not a :class:`~autothrottle.Throttle`.
        ValueError: ``pool_per_host`` with a ``transport=`` of your own (the
            pools are httpx's own transport, made per host).

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
        pool_per_host: bool = False,
        **kwargs: Unpack[_AsyncClientOptions],
    ) -> None:
        if not isinstance(throttle, Throttle):
            raise TypeError(f"throttle must be an autothrottle.Throttle, got {throttle!r}")
        _check_pool_per_host(pool_per_host, kwargs.get("transport"))
        # Set before httpx builds its transports, which goes through _wrap.
        self._throttle = throttle
        self._pool_per_host = pool_per_host
        self._timeout_set = "timeout" in kwargs
        super().__init__(**kwargs)
        # httpx adds user mounts as given, without a hook: wrap them here.
        self._mounts = {
            pattern: None if transport is None else self._wrap(transport)
            for pattern, transport in self._mounts.items()
        }

    @property
    def throttle(self) -> Throttle:
        """The throttle that paces this client's requests."""
        return self._throttle

    @property
    def timeout(self) -> httpx.Timeout:
        """The client's default timeout; setting it makes its pool timeout a
        bound on the wait for the turn (httpx's own default is not one)."""
        return self._timeout

    @timeout.setter
    def timeout(self, timeout: TimeoutTypes) -> None:
        self._timeout = httpx.Timeout(timeout)
        self._timeout_set = True

    def build_request(self, *args: Any, **kwargs: Any) -> httpx.Request:
        request = super().build_request(*args, **kwargs)
        request.extensions[_POOL_TIMEOUT_SET] = _timeout_is_set(kwargs, self._timeout_set)
        return request

    def _wrap(self, transport: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
        if isinstance(transport, AsyncThrottledTransport):
            return transport
        cache = _cache_outside(transport, self._wrap)
        if cache is not None:
            return cast(httpx.AsyncBaseTransport, cache)
        return AsyncThrottledTransport(transport, throttle=self._throttle)

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx.AsyncBaseTransport:
        if self._pool_per_host:
            make = super()._init_transport
            return self._wrap(_PoolPerHost(lambda: make(*args, **kwargs)))
        return self._wrap(super()._init_transport(*args, **kwargs))

    def _init_proxy_transport(self, *args: Any, **kwargs: Any) -> httpx.AsyncBaseTransport:
        return self._wrap(super()._init_proxy_transport(*args, **kwargs))

    def _transport_for_url(self, url: httpx.URL) -> httpx.AsyncBaseTransport:
        # Every route is wrapped already; this catches a transport swapped in
        # per request by a patch of httpx.AsyncClient (respx's "httpx" mocker).
        return self._wrap(super()._transport_for_url(url))


class ThrottledTransport(httpx.BaseTransport):
    """:class:`AsyncThrottledTransport` for the synchronous ``httpx.Client``.

    Args:
        inner: The transport that does the sending; default a new
            ``httpx.HTTPTransport()``. Closing this transport closes it.
        throttle: The engine; it may be shared with async clients and threads.

    Example::

        throttle = Throttle(start_delay=0.5)
        with httpx.Client(transport=ThrottledTransport(throttle=throttle)) as client:
            client.get("https://example.com/a")
            client.get("https://example.com/b")  # ~0.5 s later
    """

    def __init__(self, inner: httpx.BaseTransport | None = None, *, throttle: Throttle) -> None:
        if not isinstance(throttle, Throttle):
            raise TypeError(f"throttle must be an autothrottle.Throttle, got {throttle!r}")
        if inner is None:
            inner = httpx.HTTPTransport()
        elif not isinstance(inner, httpx.BaseTransport):
            raise TypeError(f"inner must be an httpx.BaseTransport, got {inner!r}")
        self._inner = inner
        self._throttle = throttle

    @property
    def inner(self) -> httpx.BaseTransport:
        """The wrapped transport."""
        return self._inner

    @property
    def throttle(self) -> Throttle:
        """The throttle that paces this transport's requests."""
        return self._throttle

    def __repr__(self) -> str:
        return f"ThrottledTransport({self._inner!r}, throttle={self._throttle!r})"

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Block for the slot's turn, send through ``inner``, and track the response."""
        send, key, options = _prepare(self._throttle, request)
        if key is None:
            return self._inner.handle_request(send)
        (bound, pool), asked = _wait_bound(send, options), perf_counter()
        try:
            lease = self._throttle.acquire_blocking(key, adjust=options.adjust, max_wait=bound)
        except ThrottleTimeout as error:
            raise _timed_out(error, request, pool) from error
        exchange = Exchange(lease, asked)
        tracer = _SyncTracer(exchange, send.extensions.get("trace"))
        extensions = _traced(send, tracer)
        try:
            response = self._inner.handle_request(send)
        except BaseException as error:
            exchange.failed(error, _host_failure)
            raise
        finally:
            send.extensions = extensions
        try:
            exchange.responded(
                response.status_code,
                response.headers,
                tracer.end,
                from_cache=_from_cache(response.extensions),
            )
        except BaseException:
            response.close()
            raise
        return _tracked(response, exchange, _SyncLeaseStream)

    def close(self) -> None:
        """Close the inner transport."""
        self._inner.close()

    def __enter__(self: _S) -> _S:
        self._inner.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self._inner.__exit__(exc_type, exc_value, traceback)


class ThrottledClient(httpx.Client):
    """An ``httpx.Client`` whose every route is throttled, for threads.

    Same arguments as ``httpx.Client`` plus ``throttle``; the default, proxy,
    ``mounts=`` and ``transport=`` transports are all wrapped in a
    :class:`ThrottledTransport`. Any number of threads may share the
    client (httpx's ``Client`` is thread-safe) or the throttle::

        throttle = Throttle(start_delay=0.5, target_concurrency=2.0)
        with ThrottledClient(throttle=throttle) as client:
            with ThreadPoolExecutor(8) as pool:
                pages = list(pool.map(client.get, urls))

    ``pool_per_host=True`` gives each origin its own connection pool, as for
    :class:`AsyncThrottledClient`.
    """

    def __init__(
        self,
        *,
        throttle: Throttle,
        pool_per_host: bool = False,
        **kwargs: Unpack[_SyncClientOptions],
    ) -> None:
        if not isinstance(throttle, Throttle):
            raise TypeError(f"throttle must be an autothrottle.Throttle, got {throttle!r}")
        _check_pool_per_host(pool_per_host, kwargs.get("transport"))
        self._throttle = throttle
        self._pool_per_host = pool_per_host
        self._timeout_set = "timeout" in kwargs
        super().__init__(**kwargs)
        self._mounts = {
            pattern: None if transport is None else self._wrap(transport)
            for pattern, transport in self._mounts.items()
        }

    @property
    def throttle(self) -> Throttle:
        """The throttle that paces this client's requests."""
        return self._throttle

    @property
    def timeout(self) -> httpx.Timeout:
        """The client's default timeout; setting it makes its pool timeout a
        bound on the wait for the turn (httpx's own default is not one)."""
        return self._timeout

    @timeout.setter
    def timeout(self, timeout: TimeoutTypes) -> None:
        self._timeout = httpx.Timeout(timeout)
        self._timeout_set = True

    def build_request(self, *args: Any, **kwargs: Any) -> httpx.Request:
        request = super().build_request(*args, **kwargs)
        request.extensions[_POOL_TIMEOUT_SET] = _timeout_is_set(kwargs, self._timeout_set)
        return request

    def _wrap(self, transport: httpx.BaseTransport) -> httpx.BaseTransport:
        if isinstance(transport, ThrottledTransport):
            return transport
        cache = _cache_outside(transport, self._wrap)
        if cache is not None:
            return cast(httpx.BaseTransport, cache)
        return ThrottledTransport(transport, throttle=self._throttle)

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx.BaseTransport:
        if self._pool_per_host:
            make = super()._init_transport
            return self._wrap(_SyncPoolPerHost(lambda: make(*args, **kwargs)))
        return self._wrap(super()._init_transport(*args, **kwargs))

    def _init_proxy_transport(self, *args: Any, **kwargs: Any) -> httpx.BaseTransport:
        return self._wrap(super()._init_proxy_transport(*args, **kwargs))

    def _transport_for_url(self, url: httpx.URL) -> httpx.BaseTransport:
        return self._wrap(super()._transport_for_url(url))
