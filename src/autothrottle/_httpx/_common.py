"""What the async and sync httpx adapters share: every decision that is not I/O.

How a request's slot, options and wait bound are found, which errors are the
host's, how a response carries what the throttle did, how a pool timeout the
user set is told from httpx's default, and the pools kept per origin.
"""

from __future__ import annotations

import math
import ssl
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

import anyio
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

from .._errors import ThrottleTimeout
from .._request import (
    CONTROL_HEADER,
    DEFAULT_OPTIONS,
    RequestOptions,
    options_from_header,
    options_from_mapping,
)
from .._throttle import Throttle

__all__ = ["ThrottlePoolTimeout"]

STARTED = ".send_request_headers.started"
COMPLETE = ".receive_response_headers.complete"


class ClientOptions(TypedDict, total=False):
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


def check_throttle(throttle: object) -> Throttle:
    if not isinstance(throttle, Throttle):
        raise TypeError(f"throttle must be an autothrottle.Throttle, got {throttle!r}")
    return throttle


def host_failure(error: BaseException) -> bool:
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


_CONTROL_KEY = "autothrottle"
_CONTROL_NAME = CONTROL_HEADER.lower().encode()


def prepare(
    throttle: Throttle, request: httpx.Request
) -> tuple[httpx.Request, str | None, RequestOptions]:
    """The request to send, its slot key (None: do not throttle it) and its options.

    A request with no host is not throttled: the inner transport refuses it
    with httpx's own error (``UnsupportedProtocol``), as a plain client would.
    """
    extensions = request.extensions
    options = (
        DEFAULT_OPTIONS if _CONTROL_KEY not in extensions else options_from_mapping(extensions)
    )
    send = request
    headers = request.headers
    # Read from httpx's own list of (name, lowercase name, value): asking
    # `headers` decodes every name and value first (about 3 µs), and almost no
    # request has the control header.
    items = getattr(headers, "_list", None)
    if type(items) is list:
        present = False
        for item in items:
            if item[1] == _CONTROL_NAME:
                present = True
                break
    else:  # not the httpx this was written against: ask it
        present = CONTROL_HEADER in headers
    if present:
        values = headers.get_list(CONTROL_HEADER)
        options = options.merged(options_from_header(", ".join(values)))
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


_DEFAULT_TIMEOUT = httpx.Timeout(5.0).as_dict()


class DefaultTimeoutDict(dict[str, float | None]):
    """A request's timeouts when they are httpx's default on a throttled client
    that was given none: its type says so, at no cost to the request."""

    __slots__ = ()


class DefaultTimeout(httpx.Timeout):
    """httpx's default timeout, as a throttled client given none keeps it: httpx
    copies it into each request with :meth:`as_dict`, which marks the copy.
    Any other timeout (set on the client later, or per request) is a plain
    ``httpx.Timeout`` again, and so a choice."""

    def as_dict(self) -> dict[str, float | None]:
        return DefaultTimeoutDict(
            connect=self.connect, read=self.read, write=self.write, pool=self.pool
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, httpx.Timeout) and httpx.Timeout.__eq__(other, self)

    __hash__ = httpx.Timeout.__hash__  # None, as httpx.Timeout's: it defines __eq__


def _pool_bound(extensions: Mapping[str, Any], client: bool) -> float | None:
    """httpx's pool timeout of a request when the user set it, else None.

    Waiting for the turn is waiting to send, as waiting for the pool is, so a
    pool timeout the user chose bounds it. httpx's default (5 s, on every
    client that was given none) does not: a wait the user did not bound must
    not fail. A throttled client marks its default (:class:`DefaultTimeout`),
    so any other timeout that reaches its transports (``client``) was chosen;
    for a plain ``httpx.AsyncClient`` around a transport, a timeout equal to
    httpx's default counts as the default.
    """
    timeout = extensions.get("timeout")
    if type(timeout) is DefaultTimeoutDict:
        return None  # a throttled client's request with httpx's default: the usual
    pool = timeout.get("pool") if isinstance(timeout, dict) else None
    if not isinstance(pool, (int, float)):
        return None
    return float(pool) if client or timeout != _DEFAULT_TIMEOUT else None


def wait_bound(request: httpx.Request, options: RequestOptions, client: bool) -> float | None:
    """The bound on the wait for the turn: the request's ``max_wait`` option,
    or a pool timeout the user set if shorter (``client``: the transport is a
    throttled client's own)."""
    extensions = request.extensions
    if type(extensions.get("timeout")) is DefaultTimeoutDict:
        return options.max_wait  # the usual: httpx's default, which bounds nothing
    pool = _pool_bound(extensions, client)
    wait = options.max_wait
    if pool is None or wait is None:
        return wait if pool is None else pool
    return min(pool, wait)


def timed_out(error: ThrottleTimeout, request: httpx.Request, client: bool) -> ThrottlePoolTimeout:
    """The error to raise for a turn that did not come, naming the bound reached."""
    pool = _pool_bound(request.extensions, client)
    if pool is not None and error.waited == pool:
        error = ThrottleTimeout(error.slot, error.waited, "httpx pool timeout")
    return ThrottlePoolTimeout(error, request)


def from_cache(extensions: Mapping[str, Any]) -> bool:
    """Whether hishel answered from its cache: ``extensions["from_cache"]``
    (hishel 0.x) or ``extensions["caching"]["from_cache"]`` (hishel 1 and 2)."""
    if extensions.get("from_cache") is True:
        return True
    caching = extensions.get("caching")
    if caching is None:  # no hishel (an ABC's isinstance is a call)
        return False
    return isinstance(caching, Mapping) and caching.get("from_cache") is True


def cache_outside(transport: Any, wrap: Callable[[Any], Any]) -> Any | None:
    """A hishel cache transport with the throttle moved inside it, or None.

    A cache hit must neither wait for the host's turn nor teach the slot; with
    the cache outside the throttle it never reaches it (``docs/compose.md``).
    """
    if type(transport).__module__.startswith("hishel") and hasattr(transport, "next_transport"):
        transport.next_transport = wrap(transport.next_transport)
        return transport
    return None


#: Put on a request being sent, for the per-origin pools: its slot, whose
#: pace says how long the origin's connection is worth keeping.
SLOT = "autothrottle.slot"


# -- a connection pool per origin ------------------------------------------------------

Origin = tuple[str, str, int | None]


class PooledOrigin:
    """One origin's connection pool, until when it is kept idle, and its requests being sent."""

    __slots__ = ("expires_at", "keep", "pool", "sending")

    def __init__(self, pool: Any, now: float, keep: float) -> None:
        self.pool = pool
        self.keep = keep
        self.expires_at = now + keep
        self.sending = 0


class Pools:
    """The pools of a client's origins, least recently used first.

    Thread-safe: the lock guards the table and the making of a pool, which
    is cheap (about 70 us: it shares the client's SSL context), never a
    pool's requests or its closing. A pool idle past its keep-alive is
    handed back to be closed. The keep-alive is ``expiry``, or the pace of
    the origin's slot when that is longer, up to ``longest``: a host paced
    every 20 s keeps its connection from one request to the next instead of
    opening a new one each time (the pools are made with httpx's keep-alive
    expiry at ``longest``, so only this table decides). Each request looks at
    a few of the oldest, so closing keeps pace with opening; a pool kept
    longer than the ones behind it holds their closing back by at most
    ``longest``.
    """

    __slots__ = ("_lock", "_make", "_origins", "expiry", "longest")

    #: Pools looked at per request for being idle past their keep-alive.
    SWEEP = 8
    #: A slot's pace times this is how long its origin's connection is kept:
    #: the next turn may come late by the throttle's jitter or the loop's lag.
    PACE_MARGIN = 1.5

    def __init__(
        self, make: Callable[[], Any], expiry: float, longest: float | None = None
    ) -> None:
        self._make = make
        self._origins: OrderedDict[Origin, PooledOrigin] = OrderedDict()
        self._lock = threading.Lock()
        self.expiry = expiry
        self.longest = expiry if longest is None else max(expiry, longest)

    def __len__(self) -> int:
        return len(self._origins)

    def keep_for(self, pace: float) -> float:
        """How long an origin whose slot sends every ``pace`` seconds is kept idle."""
        keep = pace * self.PACE_MARGIN
        if keep <= self.expiry:  # the usual answer: a host paced faster than the expiry
            return self.expiry
        return min(keep, self.longest)

    def take(self, url: httpx.URL, now: float, pace: float = 0.0) -> PooledOrigin:
        """The pool for ``url``'s origin, made on first use, counted as sending;
        ``pace``: the seconds between two of its slot's sends."""
        origin = (url.scheme, url.host, url.port)
        keep = self.keep_for(pace)
        lock = self._lock
        lock.acquire()  # not `with`: on every request, it costs twice as much
        try:
            entry = self._origins.get(origin)
            if entry is None:
                entry = self._origins[origin] = PooledOrigin(self._make(), now, keep)
            else:
                self._origins.move_to_end(origin)
                entry.keep = keep
                entry.expires_at = now + keep
            entry.sending += 1
        finally:
            lock.release()
        return entry

    def done(self, entry: PooledOrigin, now: float | None = None) -> list[Any]:
        """A request of ``entry``'s pool is sent; with ``now``, also :meth:`expired`
        (one hold of the lock for both)."""
        lock = self._lock
        lock.acquire()
        try:
            entry.sending -= 1
            return [] if now is None else self._expired(now)
        finally:
            lock.release()

    def expired(self, now: float) -> list[Any]:
        """The pools idle past their keep-alive among the oldest few, taken out of the table."""
        with self._lock:
            return self._expired(now)

    def _expired(self, now: float) -> list[Any]:
        origins = self._origins
        if not origins or next(iter(origins.values())).expires_at > now:
            return []  # the oldest is still kept: the usual answer, found at once
        closing: list[Any] = []
        for _ in range(min(self.SWEEP, len(origins))):
            origin, entry = next(iter(origins.items()))
            if entry.expires_at > now:
                break  # kept, and those after it were used more recently
            del origins[origin]
            if entry.sending or not _idle(entry.pool):
                entry.expires_at = now + entry.keep  # busy (a long download): look again later
                origins[origin] = entry
            else:
                closing.append(entry.pool)
        if closing and len(closing) * 2 > len(origins):
            # A dict never shrinks by itself: after a mass closing, rebuild it.
            self._origins = OrderedDict(origins)
        return closing

    def clear(self) -> list[Any]:
        with self._lock:
            pools = [entry.pool for entry in self._origins.values()]
            self._origins.clear()
        return pools


def _idle(transport: Any) -> bool:
    """No connection of an httpx transport's pool is busy or being opened."""
    pool = getattr(transport, "_pool", None)
    connections = getattr(pool, "connections", None)
    if connections is None:
        return True
    return all(c.is_idle() or c.is_closed() for c in connections)


def opens_connection(transport: Any) -> bool:
    """Whether a request sent now through this pool opens a connection: none is idle."""
    pool = getattr(transport, "_pool", None)
    connections = getattr(pool, "connections", None)
    if connections is None:
        return False  # not httpx's own pool: nothing known
    return not any(c.is_idle() for c in connections)


class Openings:
    """At most :attr:`LIMIT` requests of a client opening a connection at once.

    A broad crawl finds hosts faster than the client can open connections to
    them: a new connection costs the event loop about twice a request's CPU,
    and past what the loop can serve, each waits its turn in the loop until
    httpx's connect timeout (5 s) fails it, spent work and all, and the
    failures come back at the next turn. Queued here instead, a request opens
    its connection once one of the others is done: late, not lost (the host
    still sees the slot's gap, from the wire turn). httpx's own single pool
    allows 100 connections in all; this bounds only the ones being opened,
    with the request they carry. A pool timeout you set bounds the wait here
    too (``httpx.PoolTimeout``); httpx's default does not.
    """

    __slots__ = ("_async", "_sync")

    LIMIT = 100

    def __init__(self) -> None:
        self._sync = threading.BoundedSemaphore(self.LIMIT)
        self._async: anyio.Semaphore | None = None  # made in the event loop, on first use

    async def enter(self, request: httpx.Request) -> None:
        semaphore = self._async
        if semaphore is None:
            semaphore = self._async = anyio.Semaphore(self.LIMIT)
        bound = _pool_bound(request.extensions, client=True)  # the throttled client's own pools
        if bound is None:
            await semaphore.acquire()
            return
        try:
            with anyio.fail_after(bound):
                await semaphore.acquire()
        except TimeoutError as error:
            raise httpx.PoolTimeout(_OPENING_TIMEOUT.format(bound)) from error

    def leave(self) -> None:
        if self._async is not None:
            self._async.release()

    def enter_blocking(self, request: httpx.Request) -> None:
        bound = _pool_bound(request.extensions, client=True)  # the throttled client's own pools
        if not self._sync.acquire(timeout=bound):
            raise httpx.PoolTimeout(_OPENING_TIMEOUT.format(bound))

    def leave_blocking(self) -> None:
        self._sync.release()


_OPENING_TIMEOUT = "no turn to open a connection within the pool timeout ({:g} s)"


#: httpx's limits for a client given none (equal ones count as none).
_DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)

#: The longest an idle origin's connection is kept for its slot's pace, when
#: the client was given httpx's default limits: a slower host opens a new
#: connection per request, which at that pace costs little.
LONGEST_KEEP_ALIVE = 60.0


def pools_for(
    throttle: Throttle, make: Callable[..., Any], pool_per_host: bool | None, kwargs: dict[str, Any]
) -> Pools | None:
    """The per-origin pools of a client built with ``_init_transport(**kwargs)``, or None.

    Every pool shares one SSL context, made once here as httpx makes its
    own for a client: making one per pool cost 30-60 ms and most of a
    megabyte per host. Pools close after httpx's keep-alive expiry (or, with
    none, the throttle's store's idle timeout). With httpx's default limits,
    an origin whose slot's pace is longer than that expiry keeps its pool for
    the pace, up to :data:`LONGEST_KEEP_ALIVE` and the store's idle timeout
    (a pool never outlives its slot); limits you set keep their expiry.
    """
    if pool_per_host is False or kwargs.get("transport") is not None:
        return None
    context = httpx.create_ssl_context(
        verify=kwargs.get("verify", True),
        cert=kwargs.get("cert"),
        trust_env=kwargs.get("trust_env", True),
    )
    settings = {**kwargs, "verify": context, "cert": None}
    limits = kwargs.get("limits")
    expiry = getattr(limits, "keepalive_expiry", 5.0)
    idle_timeout = throttle.store.idle_timeout
    if expiry is None:
        expiry = idle_timeout
    expiry = expiry if math.isfinite(expiry) else math.inf
    longest = expiry
    if limits == _DEFAULT_LIMITS and expiry < idle_timeout:
        longest = min(LONGEST_KEEP_ALIVE, idle_timeout)
        settings["limits"] = httpx.Limits(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=longest,
        )
    return Pools(lambda: make(**settings), expiry, longest)


def check_pool_per_host(pool_per_host: object, transport: object) -> bool | None:
    if pool_per_host is not None and not isinstance(pool_per_host, bool):
        raise TypeError(f"pool_per_host must be a bool, got {pool_per_host!r}")
    if pool_per_host and transport is not None:
        raise ValueError(
            "pool_per_host=True makes httpx's own transport per host; "
            f"it cannot be combined with transport={transport!r}"
        )
    return pool_per_host
