"""The aiohttp adapter: a client middleware and two hooks that pace every request.

Use :func:`ThrottledSession` exactly where ``aiohttp.ClientSession(...)`` was::

    from autothrottle import Throttle
    from autothrottle.aiohttp import ThrottledSession

    throttle = Throttle(target_concurrency=2.0)
    async with ThrottledSession(throttle=throttle) as session:
        async with session.get("https://example.com/") as response:
            body = await response.read()

It returns a plain :class:`aiohttp.ClientSession` (aiohttp forbids subclassing
it) with these additions, which you may also install yourself with
:func:`throttle_middleware` and :func:`throttle_trace_config`:

* A client middleware, placed *last* in the session's middlewares. aiohttp
  calls the first middleware outermost, so the last one is closest to the
  wire: every attempt any other middleware makes (a retry, an auth refresh)
  and every redirect hop passes through it and is throttled on the slot of the
  URL it actually goes to. It waits for the slot's turn, sends, measures the
  latency, feeds it to the slot and holds the slot until the response is
  finished: its body has arrived to the end (for a large body, aiohttp stops
  reading from the socket until you read, so that means until read), or the
  response is released or closed, or its connection is lost. A response never
  finished stops counting after the throttle's ``hold_timeout``.
* A hook on the session's connector: when the connection is ready (a new
  connection established or a pooled one taken) it takes the request's turn
  on the wire, so the host sees the slot's spacing however long the request
  waited for a connection, and starts the latency clock there.
* Request methods of the session's own (``get``, ``post``, ... and
  ``request``) that read the per-request options from ``trace_request_ctx``
  and call aiohttp's ``_request`` as aiohttp's methods do. A session you
  build yourself reads them with :func:`throttle_trace_config` instead, at
  the cost of aiohttp's trace machinery on every request.

Per-request options, in either form (they are merged)::

    await session.get(url, trace_request_ctx={"autothrottle": {"adjust": False}})
    await session.get(url, headers={"X-AutoThrottle": "bypass"})

The ``X-AutoThrottle`` header is removed before the request goes on the wire.

.. note::
   aiohttp lets a single request replace the session's middlewares:
   ``session.get(url, middlewares=(...))`` runs only the middlewares given
   there, which drops the throttle for that request. Put one back at the end::

       session.get(url, middlewares=(my_retry, throttle_middleware(throttle)))

   Middlewares made by :func:`throttle_middleware` for one throttle are
   interchangeable: all state lives in the throttle.

.. note::
   Mocking libraries that patch ``ClientSession._request`` (aioresponses)
   skip aiohttp's middlewares altogether, so requests mocked that way are
   neither delayed nor counted.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

try:
    import aiohttp as _needed  # noqa: F401  (the extra this module needs)
except ImportError as _missing:  # pragma: no cover - depends on the environment
    from ._extras import missing_extra_error

    raise missing_extra_error("autothrottle.aiohttp", "aiohttp", "aiohttp") from _missing

import aiohttp
from aiohttp import (
    ClientHandlerType,
    ClientMiddlewareType,
    ClientRequest,
    ClientResponse,
    ClientSession,
    TraceConfig,
)
from aiohttp.connector import BaseConnector
from multidict import istr
from yarl import URL

from ._aiohttp_parts import (
    EXCHANGE,
    OPTIONS_SET,
    REQUEST,
    WIRED,
    default_connector,
    hold_until_finished,
    hook_connector,
    hook_request_options,
    on_connection_ready,
    on_request_finish,
    on_request_start,
)
from ._exchange import (
    Exchange,
    Plug,
    ThrottleInfo,
    free_exchange,
    release_unsent,
    send_failed,
    wait_turn,
)
from ._lease import Lease
from ._request import (
    CONTROL_HEADER,
    DEFAULT_OPTIONS,
    RequestOptions,
    host_key,
    options_from_header,
)
from ._throttle import Throttle, check_throttle, keys_by_host, missing_throttle

__all__ = [
    "ThrottledSession",
    "throttle_info",
    "throttle_middleware",
    "throttle_of",
    "throttle_trace_config",
]


_INFO: weakref.WeakKeyDictionary[ClientResponse, Exchange] = weakref.WeakKeyDictionary()

_traced = False
"""Whether a TraceConfig of the throttle's was made in this process (then the
middleware sets ``_aiohttp_parts.EXCHANGE`` for every request too)."""

_CONTROL = istr(CONTROL_HEADER)
"""The control header's name as an ``istr``: its case is folded once, not at
every lookup in a request's headers (on every request; a third of the cost)."""


def throttle_info(response: ClientResponse) -> ThrottleInfo | None:
    """What the throttle did to the request of ``response``, or None if it was not throttled.

    Example::

        async with session.get(url) as response:
            if is_captcha(await response.text()):
                info = throttle_info(response)
                throttle.backoff(url, sent_at=info.sent_at if info else None)
    """
    exchange = getattr(response, WIRED, None)
    if exchange is None:
        exchange = _INFO.get(response)
    return None if exchange is None else exchange.info()


def throttle_of(session: ClientSession) -> Throttle | None:
    """The throttle a session's requests go through, or None.

    ``isinstance(session, ThrottledSession)`` says whether there is one.
    """
    for middleware in getattr(session, "_middlewares", None) or ():
        owner = _middleware_of(middleware)
        if owner is not None:
            return owner.throttle
    return None


def _middleware_of(middleware: object) -> _ThrottleMiddleware | None:
    """The throttle's middleware behind ``middleware``: :func:`throttle_middleware`
    hands out its bound method (an older caller may hold the object itself)."""
    if isinstance(middleware, _ThrottleMiddleware):
        return middleware
    owner = getattr(middleware, "__self__", None)
    return owner if isinstance(owner, _ThrottleMiddleware) else None


_HOST_FAILURES: tuple[type[BaseException], ...] = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    aiohttp.ClientResponseError,
    asyncio.TimeoutError,
    TimeoutError,
    OSError,
)


def _host_failure(error: BaseException) -> bool:
    """The host failed: refused, reset, timed out, or sent a broken response.

    The middleware is the innermost, so a ``ClientResponseError`` reaching it
    is aiohttp's parser refusing what the host sent (a broken status line or
    header, headers past the session's limits), or a proxy refusing the
    tunnel: httpx's ``RemoteProtocolError`` and ``ProxyError``, which are the
    host's there. ``raise_for_status`` raises its own after the middlewares,
    once the response was observed. Other client errors (``InvalidURL``, a
    user middleware's own) are the caller's, and so is an error the request's
    body raised as aiohttp sent it (an async generator of the caller's):
    aiohttp hands it on as a plain ``ClientConnectionError`` caused by it,
    where a failed write to the socket is an ``OSError`` (``ClientOSError``).
    """
    if type(error) is aiohttp.ClientConnectionError:
        cause = error.__cause__
        return cause is None or isinstance(cause, OSError)
    return isinstance(error, _HOST_FAILURES)


def throttle_trace_config() -> TraceConfig:
    """A TraceConfig that feeds per-request options and connection timing to the middleware.

    :func:`ThrottledSession` needs none: it hooks its own session and
    connector, at a fraction of the cost of aiohttp's trace machinery. Add it
    yourself, next to :func:`throttle_middleware`, when you build the session::

        session = aiohttp.ClientSession(
            middlewares=(throttle_middleware(throttle),),
            trace_configs=[throttle_trace_config()],
        )

    Without it the middleware still throttles, but ignores
    ``trace_request_ctx`` options (the ``X-AutoThrottle`` header still works)
    and measures latency from the moment it hands the request on, which then
    includes connecting and waiting in the connector's pool.
    """
    global _traced  # read on every request: a module global costs least
    _traced = True  # the middleware sets EXCHANGE for its signals from now on
    config = TraceConfig()
    config.on_request_start.append(on_request_start)
    config.on_request_end.append(on_request_finish)
    config.on_request_exception.append(on_request_finish)
    config.on_connection_create_end.append(on_connection_ready)
    config.on_connection_reuseconn.append(on_connection_ready)
    return config


# -- the middleware -------------------------------------------------------------------


class _ThrottleMiddleware:
    """The client middleware; see :func:`throttle_middleware`.

    It is the request skeleton, ``_exchange.paced(_PLUG, ...)``, with the
    steps of :class:`_AiohttpPlug` (and ``Exchange.responded``'s usual case)
    written in, in its order: four calls fewer a request, in the one adapter
    whose every request pays aiohttp's middleware chain too. The rules stay
    ``paced``'s: ``test_the_middleware_ends_every_outcome_as_the_skeleton_does``
    (``tests/test_aiohttp_adapter.py``) sends the same requests through both
    (answered, held, failed, cancelled, timed out, observing raised) and
    asserts they end alike; a change to one goes to the other.
    """

    __slots__ = ("_by_host", "_header_options", "_header_options_seen", "throttle")

    def __init__(self, throttle: Throttle) -> None:
        self.throttle = throttle
        self._by_host = keys_by_host(throttle)
        # Options read from the control header, kept per request object: the
        # header is gone from the request after the first pass, and a retrying
        # middleware may hand the same request through again.
        self._header_options: weakref.WeakKeyDictionary[ClientRequest, RequestOptions] = (
            weakref.WeakKeyDictionary()
        )
        self._header_options_seen = False  # the dictionary's length costs a call

    def __repr__(self) -> str:
        return f"<autothrottle middleware for {self.throttle!r}>"

    def _options(self, request: ClientRequest) -> RequestOptions:
        headers = request.headers
        if _CONTROL in headers:
            values = headers.getall(_CONTROL)
            del headers[_CONTROL]
            from_header = options_from_header(", ".join(values))
            self._header_options[request] = from_header
            self._header_options_seen = True
        elif self._header_options_seen:
            from_header = self._header_options.get(request, DEFAULT_OPTIONS)
        else:
            from_header = DEFAULT_OPTIONS
        state = REQUEST.get()
        if state is None or state.done:
            return from_header
        if from_header is DEFAULT_OPTIONS:
            return state.options
        return state.options.merged(from_header)

    def _key_of(self, url: URL) -> str:
        """The slot key of ``url`` (the throttle's :meth:`~Throttle.key_for`)."""
        return self.throttle.key_for(url, host=url.raw_host or "")

    def _turn_now(
        self, request: ClientRequest, options: RequestOptions
    ) -> tuple[str, float, Lease | None]:
        """The slot key, the moment the turn was asked, and the turn if it is
        now, for a request with options set (not bypassed)."""
        key = options.slot
        if key is None:
            key = self._key_of(request.url)
        asked = perf_counter()
        lease = self.throttle.acquire_now(key, options.adjust, options.max_wait, options.cost)
        return key, asked, lease

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        if self._header_options_seen or _CONTROL in request.headers:
            options = self._options(request)
        else:  # none on it nor ever seen; the usual request: none ever in trace_request_ctx
            options = _options_in_context() if OPTIONS_SET[0] else DEFAULT_OPTIONS
        if options is DEFAULT_OPTIONS:  # none set (most requests): no option to read
            url = request.url  # keyed by host: key_for's answer, without its call
            key = host_key(url.raw_host or "") if self._by_host else self._key_of(url)
            asked = perf_counter()  # from here on, _exchange.paced with the plug written in
            lease = self.throttle.acquire_now(key)
        elif options.bypass:
            return await handler(request)
        else:
            key, asked, lease = self._turn_now(request, options)
        if lease is None:
            lease = await wait_turn(_PLUG, self.throttle, key, options, options.max_wait, request)
            exchange = Exchange(lease, asked, key)
        else:
            exchange = free_exchange(lease, asked, key)
        if options.max_wait is not None:  # the wire turn's wait counts against it too
            exchange.bound = options.max_wait
        try:  # _AiohttpPlug.wire
            request._autothrottle_exchange = exchange  # type: ignore[attr-defined]  # noqa: SLF001
            token = EXCHANGE.set(exchange) if _traced else None
        except AttributeError:
            token = EXCHANGE.set(exchange)
        except BaseException:  # nothing was sent: released, no failure counted
            release_unsent(lease)
            raise
        try:
            response = await handler(request)
        except BaseException as error:
            send_failed(_PLUG, exchange, error, request)
            raise
        finally:
            if token is not None:  # _AiohttpPlug.unwire
                EXCHANGE.reset(token)
        try:
            if type(response) is not ClientResponse:  # another class: the plug's step
                return _respond(exchange, response)
            # _respond and Exchange.responded's usual case; the exchange first
            # (if observing raises, the caller never sees the response).
            try:
                response._autothrottle_exchange = exchange  # type: ignore[attr-defined]  # noqa: SLF001
            except AttributeError:
                _INFO[response] = exchange
            latency = perf_counter() - exchange.started
            if not latency > 0.0:
                latency = 0.0
            if response._connection is None:  # noqa: SLF001  (the body came with the headers)
                lease.finish(latency, response.status, response._headers)  # noqa: SLF001
            else:
                lease.observe(latency, response.status, response._headers)  # noqa: SLF001
                hold_until_finished(response, lease)
            return response
        except BaseException:
            lease.release()  # released already if observing raised
            response.close()
            raise


def _options_in_context() -> RequestOptions:
    """The ``trace_request_ctx`` options of the request the session is making in
    this task (``REQUEST``), or none: for a request with no control header."""
    state = REQUEST.get()
    return DEFAULT_OPTIONS if state is None or state.done else state.options


class _AiohttpPlug(
    Plug[ClientRequest, ClientResponse, "contextvars.Token[Exchange | None] | None"]
):
    """How aiohttp sends and reads, for the request skeleton (``_exchange.paced``).

    The middleware writes :meth:`wire`, :meth:`unwire` and :meth:`respond`
    in (:class:`_ThrottleMiddleware`) and hands the plug only to the shared
    helpers that wait for a turn and end a failed send. The three steps run
    here when ``paced(_PLUG, ...)`` does: the reference the middleware is
    held to in ``tests/test_aiohttp_adapter.py``.
    """

    __slots__ = ()

    def host_failure(self, error: BaseException) -> bool:
        return _host_failure(error)

    def unconnected(self, error: BaseException) -> bool:
        # Raised by the connector's connect: the request was never written.
        return isinstance(error, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError))

    def wire(
        self, exchange: Exchange, request: ClientRequest
    ) -> contextvars.Token[Exchange | None] | None:
        # The connector's hook finds the exchange on the request it connects
        # for; a TraceConfig's signals, in this same task, in EXCHANGE. The
        # request keeps it after sending (nothing to undo, so the skeleton
        # makes no call for it): a user middleware that sends the request
        # again hands it through here first, which puts the new one there.
        try:
            request._autothrottle_exchange = exchange  # type: ignore[attr-defined]  # noqa: SLF001
        except AttributeError:  # a request with no room for it: the hook looks there too
            return EXCHANGE.set(exchange)
        return EXCHANGE.set(exchange) if _traced else None

    def unwire(
        self, request: ClientRequest, wiring: contextvars.Token[Exchange | None] | None
    ) -> None:
        if wiring is not None:
            EXCHANGE.reset(wiring)

    def respond(
        self, exchange: Exchange, response: ClientResponse, wiring: object
    ) -> ClientResponse:
        return _respond(exchange, response)

    def close(self, response: ClientResponse) -> None:
        response.close()


_PLUG = _AiohttpPlug()


def _respond(exchange: Exchange, response: ClientResponse) -> ClientResponse:
    """:meth:`_AiohttpPlug.respond`: observe ``response``, then hold the lease
    until its body is finished."""
    # No connection: the body came with the headers, and the response is
    # finished as it is observed (one step, under one hold of the slot's lock).
    if type(response) is ClientResponse:
        # aiohttp's own: no from_cache to look for (a failed getattr costs),
        # and its fields read without the calls of their property and reify.
        finished = response._connection is None  # noqa: SLF001
        exchange.responded(response.status, response._headers, finished=finished)  # noqa: SLF001
    else:  # another class (aiohttp-client-cache's says from_cache)
        finished = response.connection is None
        exchange.responded(
            response.status,
            response.headers,
            from_cache=getattr(response, "from_cache", False) is True,
            finished=finished,
        )
    try:  # the attribute named by WIRED, set without setattr's call
        response._autothrottle_exchange = exchange  # type: ignore[attr-defined]  # noqa: SLF001
    except AttributeError:  # a response class with __slots__
        _INFO[response] = exchange
    if not finished:
        hold_until_finished(response, exchange.lease)
    return response


def throttle_middleware(throttle: Throttle) -> ClientMiddlewareType:
    """A client middleware that paces every request through ``throttle``.

    Put it *last* in the middlewares, so every attempt other middlewares make
    goes through it; pair it with :func:`throttle_trace_config` for exact
    latency and ``trace_request_ctx`` options::

        session = aiohttp.ClientSession(
            middlewares=(my_retry, throttle_middleware(throttle)),
            trace_configs=[throttle_trace_config()],
        )

    A request that passes its own ``middlewares=`` replaces the session's
    list; include a throttle middleware there too.
    """
    check_throttle(throttle, "throttle_middleware")
    # Its bound method, not the object: aiohttp calls a middleware for every
    # request, and calling an object through its __call__ costs a tuple of the
    # arguments and a lookup more than a method (about 1.5k instructions).
    return _ThrottleMiddleware(throttle).__call__


class _SessionOptions(TypedDict, total=False):
    """``aiohttp.ClientSession`` keyword arguments, so that type checkers and
    IDEs see them through :func:`ThrottledSession`: those of aiohttp 3.12.0,
    the oldest release allowed. Keywords added since (``max_headers``,
    ``json_serialize_bytes``, ``ssl_shutdown_timeout``) still pass through at
    run time on an aiohttp that has them, but a type checker flags them."""

    connector: BaseConnector | None
    loop: asyncio.AbstractEventLoop | None
    cookies: Any
    headers: Any
    proxy: str | URL | None
    proxy_auth: aiohttp.BasicAuth | None
    skip_auto_headers: Iterable[str] | None
    auth: aiohttp.BasicAuth | None
    json_serialize: Callable[[Any], str]
    request_class: type[ClientRequest]
    response_class: type[ClientResponse]
    ws_response_class: type[aiohttp.ClientWebSocketResponse]
    version: aiohttp.HttpVersion
    cookie_jar: aiohttp.abc.AbstractCookieJar | None
    connector_owner: bool
    raise_for_status: bool | Callable[[ClientResponse], Awaitable[None]]
    read_timeout: Any
    conn_timeout: float | None
    timeout: aiohttp.ClientTimeout
    auto_decompress: bool
    trust_env: bool
    requote_redirect_url: bool
    trace_configs: list[TraceConfig] | None
    read_bufsize: int
    max_line_size: int
    max_field_size: int
    fallback_charset_resolver: Callable[[ClientResponse, bytes], str]
    middlewares: Sequence[ClientMiddlewareType]


if TYPE_CHECKING:

    class ThrottledSession(ClientSession):
        """What type checkers see: a ``ClientSession`` that also takes ``throttle``."""

        def __init__(
            self,
            base_url: str | URL | None = None,
            *,
            throttle: Throttle,
            request_options: bool = True,
            **kwargs: Unpack[_SessionOptions],
        ) -> None: ...

else:

    class _SessionFactory(type):
        """The type of :class:`ThrottledSession`: calling it builds a plain
        ``aiohttp.ClientSession`` (aiohttp forbids subclassing one), and
        ``isinstance`` tells a session whose requests go through a throttle."""

        def __call__(
            cls,
            base_url: str | URL | None = None,
            *,
            throttle: Throttle | None = None,
            request_options: bool = True,
            **kwargs: Unpack[_SessionOptions],
        ) -> ClientSession:
            # Python's own message for a missing keyword would name this
            # metaclass's __call__, a private name the user never wrote.
            if throttle is None:
                raise TypeError(missing_throttle("ThrottledSession", (base_url,), "base_url"))
            check_throttle(throttle, "ThrottledSession")
            return _throttled_session(base_url, throttle, request_options, dict(kwargs))

        def __instancecheck__(cls, instance: object) -> bool:
            return isinstance(instance, ClientSession) and throttle_of(instance) is not None

    class ThrottledSession(metaclass=_SessionFactory):
        """An ``aiohttp.ClientSession`` whose every request is paced by ``throttle``.

        Takes exactly the arguments of :class:`aiohttp.ClientSession`, plus
        ``throttle``. Your ``middlewares`` run first and the throttle's last, so
        your retries are throttled too; your ``trace_configs`` keep working::

            async with ThrottledSession(throttle=throttle, middlewares=(retry,)) as session:
                async with session.get("https://example.com/") as response:
                    await response.read()

        What it returns is a plain ``aiohttp.ClientSession`` (aiohttp forbids
        subclassing it), and ``isinstance(session, ThrottledSession)`` is true of
        every session whose middlewares include a throttle's: one made here, or
        one you built with :func:`throttle_middleware`. :func:`throttle_of`
        returns that throttle.

        Several sessions (and httpx clients) may share one throttle; they then
        share its slots.

        The wire turn and the latency clock hook the session's connector (its
        ``connect``), and ``trace_request_ctx`` options are read by the
        session's request methods (its own ``get``, ``post``, ... ``request``,
        each calling aiohttp's ``_request``), so neither costs aiohttp's trace
        signals. ``request_options=False`` keeps aiohttp's methods
        (``trace_request_ctx`` options are then ignored; the ``X-AutoThrottle``
        header still works).
        """


def _throttled_session(
    base_url: str | URL | None,
    throttle: Throttle,
    request_options: bool,
    options: dict[str, Any],
) -> ClientSession:
    middleware = throttle_middleware(throttle)
    user_middlewares = tuple(options.pop("middlewares", None) or ())
    if any(_middleware_of(m) is not None for m in user_middlewares):
        raise ValueError(
            "middlewares already contains a throttle middleware; ThrottledSession adds "
            f"its own, so requests would be throttled twice: {user_middlewares!r}"
        )
    trace_configs = list(options.pop("trace_configs", None) or ())
    connector = options.pop("connector", None)
    if connector is None:
        connector = default_connector()
    elif not isinstance(connector, BaseConnector):
        raise TypeError(f"connector must be an aiohttp.BaseConnector, got {connector!r}")
    hook_connector(connector)
    session = ClientSession(
        base_url,
        connector=connector,
        middlewares=(*user_middlewares, middleware),
        trace_configs=trace_configs,
        **options,
    )
    if request_options:
        hook_request_options(session)
    return session
