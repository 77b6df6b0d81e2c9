# Generated from _httpx/_common.py by scripts/unasync.py: edit that file and rerun.
"""What the async and sync httpx2 adapters share: every decision that is not I/O.

How a request's slot, options and wait bound are found, which errors are the
host's, how a response carries what the throttle did, how a pool timeout the
user set is told from httpx2's default, and the pools kept per origin.
"""

from __future__ import annotations

import math
import ssl
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

import httpx2
from httpx2._types import (
    AuthTypes,
    CertTypes,
    CookieTypes,
    HeaderTypes,
    ProxyTypes,
    QueryParamTypes,
    TimeoutTypes,
)

from .._errors import ThrottleTimeout
from .._exchange import Exchange
from .._request import CONTROL_HEADER, RequestOptions, options_from_header, options_from_mapping
from .._throttle import Throttle

__all__ = ["ThrottlePoolTimeout"]

STARTED = ".send_request_headers.started"
COMPLETE = ".receive_response_headers.complete"


class ClientOptions(TypedDict, total=False):
    """``httpx2.Client`` and ``httpx2.AsyncClient`` keyword arguments, so that
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
    limits: httpx2.Limits
    max_redirects: int
    event_hooks: Mapping[str, list[Callable[..., Any]]] | None
    base_url: httpx2.URL | str
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
    if isinstance(error, httpx2.PoolTimeout):
        return False
    return isinstance(
        error,
        (
            httpx2.TimeoutException,
            httpx2.NetworkError,
            httpx2.RemoteProtocolError,
            httpx2.ProxyError,
            OSError,
            TimeoutError,
        ),
    )


def _without_control_header(request: httpx2.Request) -> httpx2.Request:
    """A copy of ``request`` to send, minus the control header.

    A copy rather than an edit: the client builds redirect hops from the
    original, and they must carry the same options.
    """
    headers = httpx2.Headers(request.headers)
    del headers[CONTROL_HEADER]
    return httpx2.Request(
        request.method,
        request.url,
        headers=headers,
        stream=request.stream,
        extensions=request.extensions,
    )


def prepare(
    throttle: Throttle, request: httpx2.Request
) -> tuple[httpx2.Request, str | None, RequestOptions]:
    """The request to send, its slot key (None: do not throttle it) and its options.

    A request with no host is not throttled: the inner transport refuses it
    with httpx2's own error (``UnsupportedProtocol``), as a plain client would.
    """
    options = options_from_mapping(request.extensions)
    # get_list, not get: httpx2's get raises and catches a KeyError when the
    # header is absent, as it is from almost every request.
    values = request.headers.get_list(CONTROL_HEADER)
    send = request
    if values:
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


class ThrottlePoolTimeout(ThrottleTimeout, httpx2.PoolTimeout):
    """The wait for the turn outlasted its bound: both the library's
    :class:`~autothrottle.ThrottleTimeout` and httpx2's ``PoolTimeout`` (a
    ``TimeoutException``), so either ``except`` catches it. Nothing was sent.

    Its ``bound`` says which setting was reached: ``"max_wait"`` or
    ``"httpx2 pool timeout"`` (one you set; httpx2's default never bounds the turn).
    """

    def __init__(self, error: ThrottleTimeout, request: httpx2.Request) -> None:
        ThrottleTimeout.__init__(self, error.slot, error.waited, error.bound)
        self._request = request


#: Put on each request by the throttled clients: whether its pool timeout is
#: one the user set (on the client or the request) rather than httpx2's default.
POOL_TIMEOUT_SET = "autothrottle.pool_timeout_set"
_DEFAULT_TIMEOUT = httpx2.Timeout(5.0).as_dict()


def timeout_is_set(kwargs: Mapping[str, Any], client_timeout_set: bool) -> bool:
    """Whether a request built with ``build_request(**kwargs)`` carries a timeout
    the user chose: per request, in its extensions, or on the client."""
    if client_timeout_set:
        return True
    if kwargs.get("timeout", httpx2.USE_CLIENT_DEFAULT) is not httpx2.USE_CLIENT_DEFAULT:
        return True
    extensions = kwargs.get("extensions")
    # None first: an ABC's isinstance is a call, and most requests have none.
    return extensions is not None and isinstance(extensions, Mapping) and "timeout" in extensions


def _pool_bound(extensions: Mapping[str, Any]) -> float | None:
    """httpx2's pool timeout of a request when the user set it, else None.

    Waiting for the turn is waiting to send, as waiting for the pool is, so a
    pool timeout the user chose bounds it. httpx2's default (5 s, on every
    client that was given none) does not: a wait the user did not bound must
    not fail. The throttled clients mark each request; for a plain
    ``httpx2.AsyncClient`` around a transport, a timeout equal to httpx2's
    default counts as the default.
    """
    chosen = extensions.get(POOL_TIMEOUT_SET)
    if chosen is False:
        return None  # a throttled client's request with httpx2's default: the usual
    timeout = extensions.get("timeout")
    pool = timeout.get("pool") if isinstance(timeout, dict) else None
    if not isinstance(pool, (int, float)):
        return None
    if chosen is None:
        chosen = timeout != _DEFAULT_TIMEOUT
    return float(pool) if chosen else None


def wait_bound(
    request: httpx2.Request, options: RequestOptions
) -> tuple[float | None, float | None]:
    """The bound on the wait for the turn, and the pool timeout among it:
    the request's ``max_wait`` option, or a pool timeout the user set if shorter."""
    pool = _pool_bound(request.extensions)
    wait = options.max_wait
    if pool is None or wait is None:
        return (wait if pool is None else pool), pool
    return min(pool, wait), pool


def timed_out(
    error: ThrottleTimeout, request: httpx2.Request, pool: float | None
) -> ThrottlePoolTimeout:
    """The error to raise for a turn that did not come, naming the bound reached."""
    if pool is not None and error.waited == pool:
        error = ThrottleTimeout(error.slot, error.waited, "httpx2 pool timeout")
    return ThrottlePoolTimeout(error, request)


def _from_cache(extensions: Mapping[str, Any]) -> bool:
    """Whether hishel answered from its cache: ``extensions["from_cache"]``
    (hishel 0.x) or ``extensions["caching"]["from_cache"]`` (hishel 1 and 2)."""
    if extensions.get("from_cache") is True:
        return True
    caching = extensions.get("caching")
    if caching is None:  # no hishel (an ABC's isinstance is a call)
        return False
    return isinstance(caching, Mapping) and caching.get("from_cache") is True


def responded(exchange: Exchange, response: httpx2.Response, headers_at: float | None) -> None:
    """Observe ``response`` (its headers arrived at ``headers_at``); on an
    error the lease is released and the caller must close the response."""
    exchange.responded(
        response.status_code,
        response.headers,
        headers_at,
        from_cache=_from_cache(response.extensions),
    )


def cache_outside(transport: Any, wrap: Callable[[Any], Any]) -> Any | None:
    """A hishel cache transport with the throttle moved inside it, or None.

    A cache hit must neither wait for the host's turn nor teach the slot; with
    the cache outside the throttle it never reaches it (``docs/compose.md``).
    """
    if type(transport).__module__.startswith("hishel") and hasattr(transport, "next_transport"):
        transport.next_transport = wrap(transport.next_transport)
        return transport
    return None


def tracked(response: httpx2.Response, exchange: Exchange, stream: Any) -> httpx2.Response:
    """``response`` with what the throttle did on it, holding the lease until its
    body is finished (``stream``: the async or sync lease stream)."""
    response.extensions = {**response.extensions, "autothrottle": exchange.info()}
    if response.is_closed:  # the inner transport already read the body
        exchange.lease.release()
    else:
        response.stream = stream(response.stream, exchange.lease)
    return response


def traced(send: httpx2.Request, tracer: object) -> dict[str, Any]:
    """Put ``tracer`` on ``send``; return the extensions to restore after sending.

    The client copies these extensions into redirect hops: they must not
    inherit this hop's tracer.
    """
    extensions = send.extensions
    send.extensions = {**extensions, "trace": tracer}
    return extensions


# -- a connection pool per origin ------------------------------------------------------

Origin = tuple[str, str, int | None]


class PooledOrigin:
    """One origin's connection pool, when it was last used, and its requests being sent."""

    __slots__ = ("pool", "sending", "used_at")

    def __init__(self, pool: Any, now: float) -> None:
        self.pool = pool
        self.used_at = now
        self.sending = 0


class Pools:
    """The pools of a client's origins, least recently used first.

    Thread-safe: the lock guards the table and the making of a pool, which
    is cheap (about 70 us: it shares the client's SSL context), never a
    pool's requests or its closing. A pool idle for
    ``expiry`` seconds is handed back to be closed: httpx2 would not reuse its
    connections after their keep-alive expiry anyway. Each request looks at a
    few of the oldest, so closing keeps pace with opening.
    """

    __slots__ = ("_lock", "_make", "_origins", "expiry")

    #: Pools looked at per request for being idle past the expiry.
    SWEEP = 8

    def __init__(self, make: Callable[[], Any], expiry: float) -> None:
        self._make = make
        self._origins: OrderedDict[Origin, PooledOrigin] = OrderedDict()
        self._lock = threading.Lock()
        self.expiry = expiry

    def __len__(self) -> int:
        return len(self._origins)

    def take(self, url: httpx2.URL, now: float) -> PooledOrigin:
        """The pool for ``url``'s origin, made on first use, counted as sending."""
        origin = (url.scheme, url.host, url.port)
        lock = self._lock
        lock.acquire()  # not `with`: on every request, it costs twice as much
        try:
            entry = self._origins.get(origin)
            if entry is None:
                entry = self._origins[origin] = PooledOrigin(self._make(), now)
            else:
                self._origins.move_to_end(origin)
                entry.used_at = now
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
        """The pools idle for ``expiry`` among the oldest few, taken out of the table."""
        with self._lock:
            return self._expired(now)

    def _expired(self, now: float) -> list[Any]:
        cutoff = now - self.expiry
        origins = self._origins
        if not origins or next(iter(origins.values())).used_at > cutoff:
            return []  # the oldest was used lately: the usual answer, found at once
        closing: list[Any] = []
        for _ in range(min(self.SWEEP, len(origins))):
            origin, entry = next(iter(origins.items()))
            if entry.used_at > cutoff:
                break  # everything after it was used more recently
            del origins[origin]
            if entry.sending or not _idle(entry.pool):
                entry.used_at = now  # busy (a long download): look again later
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
    """No connection of an httpx2 transport's pool is busy or being opened."""
    pool = getattr(transport, "_pool", None)
    connections = getattr(pool, "connections", None)
    if connections is None:
        return True
    return all(c.is_idle() or c.is_closed() for c in connections)


def pools_for(
    throttle: Throttle, make: Callable[..., Any], pool_per_host: bool | None, kwargs: dict[str, Any]
) -> Pools | None:
    """The per-origin pools of a client built with ``_init_transport(**kwargs)``, or None.

    Every pool shares one SSL context, made once here as httpx2 makes its
    own for a client: making one per pool cost 30-60 ms and most of a
    megabyte per host. Pools close after httpx2's keep-alive expiry (or, with
    none, the throttle's store's idle timeout).
    """
    if pool_per_host is False or kwargs.get("transport") is not None:
        return None
    context = httpx2.create_ssl_context(
        verify=kwargs.get("verify", True),
        cert=kwargs.get("cert"),
        trust_env=kwargs.get("trust_env", True),
    )
    settings = {**kwargs, "verify": context, "cert": None}
    limits = kwargs.get("limits")
    expiry = getattr(limits, "keepalive_expiry", 5.0)
    if expiry is None:
        expiry = throttle.store.idle_timeout
    return Pools(lambda: make(**settings), expiry if math.isfinite(expiry) else math.inf)


def check_pool_per_host(pool_per_host: object, transport: object) -> bool | None:
    if pool_per_host is not None and not isinstance(pool_per_host, bool):
        raise TypeError(f"pool_per_host must be a bool, got {pool_per_host!r}")
    if pool_per_host and transport is not None:
        raise ValueError(
            "pool_per_host=True makes httpx2's own transport per host; "
            f"it cannot be combined with transport={transport!r}"
        )
    return pool_per_host
