"""What the async and sync httpx adapters share: every decision that is not I/O.

How a request's slot, options and wait bound are found, which errors are the
host's, how a response carries what the throttle did, how a pool timeout the
user set is told from httpx's default. The pools kept per origin are in
``_pools``.
"""

from __future__ import annotations

import contextlib
import inspect
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from operator import attrgetter, itemgetter
from typing import Any, TypedDict

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
from .._headers import raw_names
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
FAILED = ".failed"
"""httpcore's event for a step that raised (connect, TLS, a retry's sleep, ...)."""


def _fields() -> Callable[[httpx.Headers], list[tuple[bytes, bytes, bytes]]] | None:
    """How the engine reads a response's raw names: httpx's own list of (name,
    lowercase name, value), where ``Headers.raw`` copies it into pairs by a
    Python loop on every call; None (``.raw``) for an httpx that keeps none."""
    items = getattr(httpx.Headers({"A": "b"}), "_list", None)
    return attrgetter("_list") if items == [(b"A", b"a", b"b")] else None


raw_names(httpx.Headers, _fields())  # the engine checks a response's names undecoded


def _refers_back() -> bool:
    """Whether the client wraps each response's stream in one that refers back
    to the response (httpx 0.28's ``BoundAsyncStream``, for ``elapsed``): a
    reference cycle per response, which only the garbage collector frees."""
    bound = getattr(getattr(httpx, "_client", None), "BoundAsyncStream", None)
    try:
        return bound is not None and "response" in inspect.signature(bound).parameters
    except (TypeError, ValueError):
        return False


STREAM_REFERS_BACK = _refers_back()
"""Read once: a throttled response's stream breaks that cycle when it closes."""


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


def host_failure(error: BaseException) -> bool:
    """The host failed: it refused, reset, timed out or broke the protocol.

    A pool timeout is this client's own congestion, and the other transport
    errors (an unsupported scheme, a malformed request) are the caller's. So
    is whatever the request's body raised as it was sent (:class:`CallersBody`),
    a transport error of another host's download it relays included: httpx
    hands it on as it was raised (an httpcore error as httpx's, caused by it).
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
    ) and not (raised_by_a_body(error) or raised_by_a_body(error.__cause__))


_BODY_RAISED = "_autothrottle_raised_by_a_body"
"""The mark :class:`CallersBody` leaves on an error its body raised."""


def raised_by_a_body(error: BaseException | None) -> bool:
    """Whether a request's body raised ``error`` as it was sent (:class:`CallersBody`)."""
    return error is not None and getattr(error, _BODY_RAISED, False) is True


def _mark(error: BaseException) -> None:
    # On the error itself: httpx hands it on as it is, through httpcore and any
    # transport between, where a note kept anywhere else would have to be found.
    with contextlib.suppress(AttributeError, TypeError):  # an error with no room for it
        setattr(error, _BODY_RAISED, True)


class CallersBody(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A request's body read as it is sent (an iterator of the caller's, a file,
    multipart), passed on chunk for chunk; what reading it raises is marked as
    the body's, so that the request's failure is the caller's, never the
    host's it was sent to (:func:`host_failure`). A body that relays another
    host's download raises that host's transport errors, which are httpx's
    own kinds (``ReadError``, ``RemoteProtocolError``) and would otherwise
    count as this host's failure and back it off.

    Sync and async in one class, as httpx's ``MultipartStream`` is: the
    client's transport iterates it its way."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        except Exception as error:
            _mark(error)
            raise

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except Exception as error:
            _mark(error)
            raise

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


_BYTES = httpx.ByteStream
"""The body of a request with none, or with bytes: nothing to read as it is sent."""


def unconnected(error: BaseException) -> bool:
    """The host's failure was a connection never made (refused, a connect
    timeout, a name not found, a TLS handshake that failed: httpcore raises
    these while it connects, before a byte of the request is written)."""
    return isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))


def _to_send(request: httpx.Request, strip: bool, wrap: bool) -> httpx.Request:
    """The copy of ``request`` to send, made once: minus the control header
    (``strip``), and its body read through :class:`CallersBody` (``wrap``: a
    body read as it is sent, not bytes); ``request`` itself when neither applies.

    A copy rather than an edit: the client builds redirect hops from the
    original, which must carry the same options, and a client resending it
    may read its own stream again.
    """
    stream = request.stream
    if wrap and type(stream) is not CallersBody:
        stream = CallersBody(stream)
    elif not strip:
        return request
    headers = request.headers
    if strip:
        headers = httpx.Headers(headers)
        del headers[CONTROL_HEADER]
    return httpx.Request(
        request.method, request.url, headers=headers, stream=stream, extensions=request.extensions
    )


_CONTROL_KEY = "autothrottle"
_CONTROL_NAME = CONTROL_HEADER.lower().encode()
_LOWERCASE_NAME = itemgetter(1)  # of httpx's (name, lowercase name, value)


def check_control_header(request: httpx.Request) -> None:
    """Raise the ``ValueError`` a bad ``X-AutoThrottle`` header would raise at
    :func:`prepare`, as a throttled client builds the request: an SDK that
    takes whatever ``send`` raises for a connection error (``anthropic``
    wraps it as ``APIConnectionError``, and retries it) would otherwise retry
    a mistake of the caller's and report it as the network's. The header is
    read as :func:`prepare` reads it, without decoding every header."""
    headers = request.headers
    try:
        items = headers._list  # noqa: SLF001 (httpx's own, checked by _fields)
    except AttributeError:
        items = None
    if type(items) is list:
        present = _CONTROL_NAME in map(_LOWERCASE_NAME, items)
    else:
        present = CONTROL_HEADER in headers
    if present:
        options_from_header(", ".join(headers.get_list(CONTROL_HEADER)))


def prepare(
    throttle: Throttle, request: httpx.Request, client: bool
) -> tuple[httpx.Request, str | None, RequestOptions, float | None]:
    """The request to send, its slot key (None: do not throttle it), its
    options and the bound on its wait for the turn (:func:`wait_bound`;
    ``client``: the transport is a throttled client's own). One call, one
    read of the request, for all four.

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
    try:  # an attribute read; getattr's default would cost a call
        items = headers._list  # noqa: SLF001 (httpx's own, checked by _fields)
    except AttributeError:
        items = None
    if type(items) is list:  # each name compared in C: no bytecode per header
        present = _CONTROL_NAME in map(_LOWERCASE_NAME, items)
    else:  # not the httpx this was written against: ask it
        present = CONTROL_HEADER in headers
    # One copy of the request to send at most (_to_send): the control header
    # dropped, and a body read as it is sent wrapped, its errors the caller's.
    if present:
        values = headers.get_list(CONTROL_HEADER)
        options = options.merged(options_from_header(", ".join(values)))
        if options.bypass:  # not throttled: its errors are nobody's to judge
            return _to_send(request, True, False), None, options, None
        send = _to_send(request, True, type(request.stream) is not _BYTES)
    elif options.bypass:
        return send, None, options, None
    elif type(send.stream) is not _BYTES:
        send = _to_send(request, False, True)
    if type(extensions.get("timeout")) is DefaultTimeoutDict:
        bound = options.max_wait  # the usual: httpx's default, which bounds nothing
    else:
        bound = wait_bound(send, options, client)
    if options.slot is not None:
        return send, options.slot, options, bound
    url = request.url
    # httpx's parsed form: the host as the slot key has it (IDNA-encoded),
    # where `url.host` decodes an international name at every call.
    try:
        host = url._uri_reference.host  # noqa: SLF001
    except AttributeError:  # not the httpx this was written against
        host = url.host
    if not host:
        return send, None, options, None
    return send, throttle.key_for(url, host=host), options, bound


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
        # The four fields httpcore reads of the "timeout" extension, by name
        # (not the instance's __dict__, which would carry along unchecked any
        # attribute a later httpx adds); a literal, not keywords: one per request.
        return DefaultTimeoutDict(
            {"connect": self.connect, "read": self.read, "write": self.write, "pool": self.pool}
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, httpx.Timeout) and httpx.Timeout.__eq__(other, self)

    __hash__ = httpx.Timeout.__hash__  # None, as httpx.Timeout's: it defines __eq__


def pool_bound(extensions: Mapping[str, Any], client: bool) -> float | None:
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
    pool = pool_bound(extensions, client)
    wait = options.max_wait
    if pool is None or wait is None:
        return wait if pool is None else pool
    return min(pool, wait)


def timed_out(error: ThrottleTimeout, request: httpx.Request, client: bool) -> ThrottlePoolTimeout:
    """The error to raise for a turn that did not come, naming the bound reached."""
    pool = pool_bound(request.extensions, client)
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
