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
* A hook on the session's ``_request`` that reads the per-request options
  from ``trace_request_ctx``. A session you build yourself reads them with
  :func:`throttle_trace_config` instead, at the cost of aiohttp's trace
  machinery on every request.

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
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from types import SimpleNamespace
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
    TraceConnectionCreateEndParams,
    TraceConnectionReuseconnParams,
    TraceRequestEndParams,
    TraceRequestExceptionParams,
    TraceRequestStartParams,
)
from aiohttp.connector import BaseConnector, Connection
from yarl import URL

from ._exchange import Exchange, Hold, ThrottleInfo
from ._lease import Lease
from ._request import (
    CONTROL_HEADER,
    DEFAULT_OPTIONS,
    RequestOptions,
    options_from_header,
    options_from_mapping,
)
from ._throttle import Throttle

__all__ = [
    "ThrottledSession",
    "throttle_info",
    "throttle_middleware",
    "throttle_of",
    "throttle_trace_config",
]

_EXCHANGE_ATTRIBUTE = "_autothrottle_exchange"
"""Where a throttled response keeps its exchange (its :class:`ThrottleInfo` is
made from it when asked for): an attribute, which costs a fraction of an entry
in a ``WeakKeyDictionary``; that is kept for response classes with no room."""

_INFO: weakref.WeakKeyDictionary[ClientResponse, Exchange] = weakref.WeakKeyDictionary()


def throttle_info(response: ClientResponse) -> ThrottleInfo | None:
    """What the throttle did to the request of ``response``, or None if it was not throttled.

    Example::

        async with session.get(url) as response:
            if is_captcha(await response.text()):
                info = throttle_info(response)
                throttle.backoff(url, sent_at=info.sent_at if info else None)
    """
    exchange = getattr(response, _EXCHANGE_ATTRIBUTE, None)
    if exchange is None:
        exchange = _INFO.get(response)
    return None if exchange is None else exchange.info()


def throttle_of(session: ClientSession) -> Throttle | None:
    """The throttle a session's requests go through, or None.

    ``isinstance(session, ThrottledSession)`` says whether there is one.
    """
    for middleware in getattr(session, "_middlewares", None) or ():
        if isinstance(middleware, _ThrottleMiddleware):
            return middleware.throttle
    return None


_HOST_FAILURES: tuple[type[BaseException], ...] = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    asyncio.TimeoutError,
    TimeoutError,
    OSError,
)


def _host_failure(error: BaseException) -> bool:
    """The host failed: refused, reset, timed out, or sent a broken body.

    Other client errors (``InvalidURL``, a user middleware's own) are the caller's.
    """
    return isinstance(error, _HOST_FAILURES)


@dataclass(eq=False, slots=True)
class _RequestState:
    """A request's options from ``trace_request_ctx``, for the middleware."""

    options: RequestOptions
    previous: _RequestState | None
    done: bool = False


# The request being made by the current task: set for the request's life by
# the session's _request hook, or by the TraceConfig from on_request_start to
# on_request_end/on_request_exception. Requests nest (a middleware may make a
# request of its own before calling its handler), so the end restores the
# value seen at the start.
_REQUEST: contextvars.ContextVar[_RequestState | None] = contextvars.ContextVar(
    "autothrottle_aiohttp_request", default=None
)

# The exchange the middleware is sending now. The connector sends the
# connection signals from inside the handler, in the same task, so they find it.
_EXCHANGE: contextvars.ContextVar[Exchange | None] = contextvars.ContextVar(
    "autothrottle_aiohttp_exchange", default=None
)


# -- trace config ------------------------------------------------------------------


def _options_of(trace_request_ctx: object) -> RequestOptions:
    """Options from ``trace_request_ctx``: a mapping's ``"autothrottle"`` key, or
    an object's ``autothrottle`` attribute (other tracers share the context)."""
    if trace_request_ctx is None or isinstance(trace_request_ctx, Mapping):
        return options_from_mapping(trace_request_ctx)
    found = getattr(trace_request_ctx, "autothrottle", None)
    return DEFAULT_OPTIONS if found is None else options_from_mapping({"autothrottle": found})


async def _on_request_start(
    session: ClientSession, ctx: SimpleNamespace, params: TraceRequestStartParams
) -> None:
    options = _options_of(getattr(ctx, "trace_request_ctx", None))
    state = _RequestState(options, _REQUEST.get())
    ctx.autothrottle_state = state
    _REQUEST.set(state)


async def _on_request_finish(
    session: ClientSession,
    ctx: SimpleNamespace,
    params: TraceRequestEndParams | TraceRequestExceptionParams,
) -> None:
    state: _RequestState | None = getattr(ctx, "autothrottle_state", None)
    if state is None:
        return
    state.done = True
    if _REQUEST.get() is state:
        previous = state.previous
        while previous is not None and previous.done:
            previous = previous.previous
        _REQUEST.set(previous)


async def _on_connection_ready(
    session: ClientSession,
    ctx: SimpleNamespace,
    params: TraceConnectionCreateEndParams | TraceConnectionReuseconnParams,
) -> None:
    exchange = _EXCHANGE.get()
    if exchange is not None:
        await exchange.on_wire()


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
    config = TraceConfig()
    config.on_request_start.append(_on_request_start)
    config.on_request_end.append(_on_request_finish)
    config.on_request_exception.append(_on_request_finish)
    config.on_connection_create_end.append(_on_connection_ready)
    config.on_connection_reuseconn.append(_on_connection_ready)
    return config


_HOOKED_CONNECTORS: weakref.WeakSet[BaseConnector] = weakref.WeakSet()
"""Connectors whose ``connect`` is wrapped already (a connector may serve several sessions)."""


def _hook_connector(connector: BaseConnector) -> None:
    """Take the wire turn when the connector hands over a ready connection.

    Cheaper than trace signals: one wrapper around ``connect`` per session's
    connector, instead of aiohttp's trace machinery on every request. A
    connector shared by several sessions is wrapped once.
    """
    if connector in _HOOKED_CONNECTORS:
        return
    connect = connector.connect

    # aiohttp's signature, spelled out (its names too: it passes them as keywords);
    # repacking *args and **kwargs costs on every request.
    async def connect_then_wire(
        req: ClientRequest,
        traces: Any,
        timeout: Any,  # noqa: ASYNC109 (aiohttp's own parameter)
    ) -> Connection:
        connection = await connect(req, traces, timeout)
        exchange = _EXCHANGE.get()
        if exchange is not None and (wait := exchange.wire_now()) > 0.0:
            try:
                await exchange.on_wire(wait)
            except BaseException:
                connection.close()
                raise
        return connection

    connector.connect = connect_then_wire  # type: ignore[method-assign]
    _HOOKED_CONNECTORS.add(connector)


def _hook_request_options(session: ClientSession) -> None:
    """Read ``trace_request_ctx`` options where the session takes them, for the middleware.

    What :func:`throttle_trace_config` does, without a TraceConfig: with any
    trace config at all, aiohttp builds the parameters of, and awaits, every
    signal of every request (about 14 µs a request, ``docs/benchmarks.md``).
    This wraps the session's ``_request`` once instead (every request method
    goes through it, as the connector's ``connect`` is wrapped): a request
    without ``trace_request_ctx`` goes on untouched, unless it is made from
    inside another (a middleware's own request), where the outer options must
    not leak into it.
    """
    send = session._request  # noqa: SLF001 (aiohttp's one entry of every request method)

    def request(*args: Any, **kwargs: Any) -> Any:
        ctx = kwargs.get("trace_request_ctx")
        if ctx is None and _REQUEST.get() is None:
            return send(*args, **kwargs)
        return _request_with_options(send, ctx, args, kwargs)

    # Past aiohttp's warning about setting attributes (in its debug mode): the
    # session is ours, made by ThrottledSession.
    object.__setattr__(session, "_request", request)


async def _request_with_options(
    send: Callable[..., Awaitable[ClientResponse]],
    ctx: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> ClientResponse:
    state = _RequestState(_options_of(ctx), None)
    token = _REQUEST.set(state)
    try:
        return await send(*args, **kwargs)
    finally:
        state.done = True
        _REQUEST.reset(token)


# -- holding the slot until the response is finished --------------------------------


class _Hold(Hold):
    """Releases a lease when its response is finished, exactly once.

    aiohttp releases (or closes) a response's connection when the body has
    arrived to the end, when the response is released or closed, and when a
    never-closed response is collected; :meth:`finished` rides on that. Two
    backstops: the connection being lost mid-body (server gone, session
    closed), and the exchange's :class:`~autothrottle._exchange.Hold` (which
    this is), which releases a response collected without reaching its
    connection. The throttle's ``hold_timeout`` bounds everything else.
    """

    __slots__ = ("_closed",)

    def __init__(self, lease: Lease, response: object, closed: asyncio.Future[None] | None) -> None:
        Hold.__init__(self, lease, response)
        self._closed = closed
        if closed is not None:
            closed.add_done_callback(self._on_lost)

    def finished(self) -> None:
        if self._closed is not None:
            self._closed.remove_done_callback(self._on_lost)
            self._closed = None
        self.release()

    def _on_lost(self, closed: asyncio.Future[None]) -> None:
        if not closed.cancelled():
            closed.exception()  # seen here; keeps asyncio from logging it
        self.finished()


def _unpin(response: ClientResponse) -> None:
    """Let a response that its caller dropped unread be collected.

    aiohttp registers the response's own end-of-body callback on its body
    stream, which the connection keeps alive, so a dropped response lives as
    long as its stalled connection and its lease until ``hold_timeout``.
    Holding that callback weakly lets the response be collected; aiohttp then
    releases its connection, which finishes the hold. If aiohttp's internals
    differ from what is expected here, nothing changes.
    """
    callbacks = getattr(getattr(response, "content", None), "_eof_callbacks", None)
    if not isinstance(callbacks, list):
        return
    for index, callback in enumerate(callbacks):
        if getattr(callback, "__self__", None) is response:
            callbacks[index] = _WeakCallback(callback)


class _WeakCallback:
    """A bound method held weakly; calling it after its object died does nothing.

    ``weakref.WeakMethod`` does the same at several times the cost.
    """

    __slots__ = ("_function", "_self")

    def __init__(self, method: Callable[[], None]) -> None:
        self._function: Callable[[object], None] = method.__func__  # type: ignore[attr-defined]
        self._self = weakref.ref(method.__self__)  # type: ignore[attr-defined]

    def __call__(self) -> None:
        target = self._self()
        if target is not None:
            self._function(target)


def _hold_until_finished(response: ClientResponse, lease: Lease) -> None:
    connection = response.connection
    if connection is None or response.status == 101:
        # No connection: the body came with the headers (or there is none).
        # 101: an upgraded connection (WebSocket) lives on its own terms; the
        # request itself is over once the upgrade is answered.
        lease.release()
        return
    protocol = connection.protocol
    # ResponseHandler.closed came after aiohttp 3.12.0: without it, a
    # connection lost mid-body releases when the response is read or closed.
    closed: asyncio.Future[None] | None = getattr(protocol, "closed", None)
    if (
        protocol is None
        or getattr(protocol, "transport", True) is None
        or (closed is not None and closed.done())
    ):
        # The connection is already gone: the body can never finish.
        lease.release()
        return
    hold = _Hold(lease, response, closed)
    connection.add_callback(hold.finished)
    _unpin(response)


# -- the middleware -------------------------------------------------------------------


class _ThrottleMiddleware:
    """The client middleware; see :func:`throttle_middleware`."""

    __slots__ = ("_header_options", "_header_options_seen", "throttle")

    def __init__(self, throttle: Throttle) -> None:
        self.throttle = throttle
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
        if CONTROL_HEADER in headers:
            values = headers.getall(CONTROL_HEADER)
            del headers[CONTROL_HEADER]
            from_header = options_from_header(", ".join(values))
            self._header_options[request] = from_header
            self._header_options_seen = True
        elif self._header_options_seen:
            from_header = self._header_options.get(request, DEFAULT_OPTIONS)
        else:
            from_header = DEFAULT_OPTIONS
        state = _REQUEST.get()
        if state is None or state.done:
            return from_header
        if from_header is DEFAULT_OPTIONS:
            return state.options
        return state.options.merged(from_header)

    def _key(self, request: ClientRequest, options: RequestOptions) -> str:
        if options.slot is not None:
            return options.slot
        url = request.url
        return self.throttle.key_for(url, host=url.raw_host or "")

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        options = self._options(request)
        if options.bypass:
            return await handler(request)
        throttle = self.throttle
        asked = perf_counter()
        exchange = Exchange(
            await throttle.acquire(
                self._key(request, options),
                adjust=options.adjust,
                max_wait=options.max_wait,
                cost=options.cost,
            ),
            asked,
        )
        token = _EXCHANGE.set(exchange)
        try:
            response = await handler(request)
        except BaseException as error:
            exchange.failed(error, _host_failure)
            raise
        finally:
            _EXCHANGE.reset(token)
        # aiohttp's own response has no from_cache (a failed getattr costs).
        from_cache = type(response) is not ClientResponse and (
            getattr(response, "from_cache", False) is True
        )
        try:
            exchange.responded(response.status, response.headers, from_cache=from_cache)
        except BaseException:
            response.close()
            raise
        try:
            setattr(response, _EXCHANGE_ATTRIBUTE, exchange)
        except AttributeError:  # a response class with __slots__
            _INFO[response] = exchange
        _hold_until_finished(response, exchange.lease)
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
    if not isinstance(throttle, Throttle):
        raise TypeError(f"throttle must be an autothrottle.Throttle, got {throttle!r}")
    return _ThrottleMiddleware(throttle)


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
            throttle: Throttle,
            request_options: bool = True,
            **kwargs: Unpack[_SessionOptions],
        ) -> ClientSession:
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
        ``connect``), and ``trace_request_ctx`` options are read by a hook on the
        session's ``_request``, so neither costs aiohttp's trace signals.
        ``request_options=False`` leaves that hook out (``trace_request_ctx``
        options are then ignored; the ``X-AutoThrottle`` header still works).
        """


def _throttled_session(
    base_url: str | URL | None,
    throttle: Throttle,
    request_options: bool,
    options: dict[str, Any],
) -> ClientSession:
    middleware = throttle_middleware(throttle)
    user_middlewares = tuple(options.pop("middlewares", None) or ())
    if any(isinstance(m, _ThrottleMiddleware) for m in user_middlewares):
        raise ValueError(
            "middlewares already contains a throttle middleware; ThrottledSession adds "
            f"its own, so requests would be throttled twice: {user_middlewares!r}"
        )
    trace_configs = list(options.pop("trace_configs", None) or ())
    connector = options.pop("connector", None)
    if connector is None:
        connector = aiohttp.TCPConnector()
    elif not isinstance(connector, BaseConnector):
        raise TypeError(f"connector must be an aiohttp.BaseConnector, got {connector!r}")
    _hook_connector(connector)
    session = ClientSession(
        base_url,
        connector=connector,
        middlewares=(*user_middlewares, middleware),
        trace_configs=trace_configs,
        **options,
    )
    if request_options:
        _hook_request_options(session)
    return session
