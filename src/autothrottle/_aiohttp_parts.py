"""What the aiohttp adapter hooks into a session: the options a request carries, the
wire turn on the connector's ready connection, the trace signals, and holding the
slot until a response's body is finished."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from time import perf_counter
from types import SimpleNamespace
from typing import Any

import aiohttp.client
from aiohttp import (
    ClientRequest,
    ClientResponse,
    ClientSession,
    TraceConnectionCreateEndParams,
    TraceConnectionReuseconnParams,
    TraceRequestEndParams,
    TraceRequestExceptionParams,
    TraceRequestStartParams,
    hdrs,
)
from aiohttp.connector import BaseConnector, Connection, TCPConnector

from ._exchange import Exchange
from ._extras import require_privates
from ._hold import Watch, watch
from ._lease import Lease
from ._request import (
    DEFAULT_OPTIONS,
    RequestOptions,
    options_from_mapping,
)

#: aiohttp's private names the adapter is built on (``tests/test_privates.py``):
#: checked here, at import, so that a release without one fails before a crawl.
PRIVATES = (
    "client._RequestContextManager",
    "ClientSession._request",
    "ClientResponse._connection",
    "ClientResponse._headers",
)
require_privates(aiohttp, PRIVATES)

_RequestContextManager = aiohttp.client._RequestContextManager  # noqa: SLF001
"""What aiohttp's request methods return (an awaitable and async context
manager around ``_request``'s coroutine): the session's own methods here
return it too."""

__all__ = [
    "EXCHANGE",
    "OPTIONS_SET",
    "REQUEST",
    "WIRED",
    "default_connector",
    "hold_until_finished",
    "hook_connector",
    "hook_request_options",
    "on_connection_ready",
    "on_request_finish",
    "on_request_start",
]


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
REQUEST: contextvars.ContextVar[_RequestState | None] = contextvars.ContextVar(
    "autothrottle_aiohttp_request", default=None
)

OPTIONS_SET = [False]
"""Whether a request of this process has carried options in ``trace_request_ctx``
(a ``_RequestState`` was made; set before ``REQUEST`` is): until then ``REQUEST``
is None in every context, so the middleware and the session's request methods
read it only once this is true (most crawls never pass options: a context
variable's ``get`` fewer on every request, and its branch). A one-item list,
so that the modules that import it see it change."""

# The exchange the middleware is sending now, for the TraceConfig's connection
# signals (sent from inside the handler, in the same task), once a
# throttle_trace_config was made (``aiohttp._traced``). The connector's own hook finds it on
# the request it connects for (WIRED), at a fraction of a context variable's cost.
EXCHANGE: contextvars.ContextVar[Exchange | None] = contextvars.ContextVar(
    "autothrottle_aiohttp_exchange", default=None
)

WIRED = "_autothrottle_exchange"
"""The attribute that holds a request's exchange while it is sent (None after), and
a throttled response's (its :class:`ThrottleInfo` is made from it when asked for).
An attribute costs a fraction of an entry in a ``WeakKeyDictionary``, which is
kept for response classes with no room. The hot paths write and read it by
this name literally, without ``setattr``'s or ``getattr``'s call."""

# -- trace config ------------------------------------------------------------------


def _options_of(trace_request_ctx: object) -> RequestOptions:
    """Options from ``trace_request_ctx``: a mapping's ``"autothrottle"`` key, or
    an object's ``autothrottle`` attribute (other tracers share the context)."""
    if trace_request_ctx is None or isinstance(trace_request_ctx, Mapping):
        return options_from_mapping(trace_request_ctx)
    found = getattr(trace_request_ctx, "autothrottle", None)
    return DEFAULT_OPTIONS if found is None else options_from_mapping({"autothrottle": found})


def _enter_request(
    trace_request_ctx: object, previous: _RequestState | None
) -> tuple[_RequestState, contextvars.Token[_RequestState | None]]:
    """Make the current task's request the one ``trace_request_ctx`` gives options
    for (``previous``: the request it is made inside, if any). The one place that
    sets ``OPTIONS_SET``: before ``REQUEST``, which is read only once it is true."""
    state = _RequestState(_options_of(trace_request_ctx), previous)
    OPTIONS_SET[0] = True
    return state, REQUEST.set(state)


async def on_request_start(
    session: ClientSession, ctx: SimpleNamespace, params: TraceRequestStartParams
) -> None:
    state, _ = _enter_request(getattr(ctx, "trace_request_ctx", None), REQUEST.get())
    ctx.autothrottle_state = state


async def on_request_finish(
    session: ClientSession,
    ctx: SimpleNamespace,
    params: TraceRequestEndParams | TraceRequestExceptionParams,
) -> None:
    state: _RequestState | None = getattr(ctx, "autothrottle_state", None)
    if state is None:
        return
    state.done = True
    if REQUEST.get() is state:
        previous = state.previous
        while previous is not None and previous.done:
            previous = previous.previous
        REQUEST.set(previous)


async def on_connection_ready(
    session: ClientSession,
    ctx: SimpleNamespace,
    params: TraceConnectionCreateEndParams | TraceConnectionReuseconnParams,
) -> None:
    exchange = EXCHANGE.get()
    if exchange is not None:
        await exchange.on_wire()


def default_connector() -> TCPConnector:
    """The connector of a throttled session given none: aiohttp's own, with a
    ``limit`` of half the process's file descriptors (at least aiohttp's 100).

    aiohttp's default ``limit=100`` caps the requests of all hosts together
    that hold a connection. A broad crawl of thousands of hosts, each paced
    by its slot (which bounds the host's own requests), reaches it whenever
    the machine slows the client, and aiohttp then wakes each waiting request
    in time proportional to the hosts waiting: on 10,000 hosts most of the
    client's CPU went there (``docs/benchmarks.md``, "crawl_10k"). The cap
    left is the one it stands for: the file descriptors a process may open.
    A connector you give keeps its own limit.
    """
    descriptors = _descriptors()
    return TCPConnector(limit=0 if descriptors is None else max(_AIOHTTP_LIMIT, descriptors // 2))


def _descriptors() -> int | None:
    """The process's soft limit of open file descriptors, or None where there is none."""
    try:
        import resource  # not on Windows
    except ImportError:  # pragma: no cover
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else soft


_AIOHTTP_LIMIT = 100


_HOOKED_CONNECTORS: weakref.WeakSet[BaseConnector] = weakref.WeakSet()
"""Connectors whose ``connect`` is wrapped already (a connector may serve several sessions)."""


def hook_connector(connector: BaseConnector) -> None:
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
        try:  # WIRED, read without getattr's call (a third of what this hook costs)
            exchange: Exchange | None = req._autothrottle_exchange  # type: ignore[attr-defined]  # noqa: SLF001
        except AttributeError:  # not throttled (bypassed, another session's), or no room for it
            exchange = None
        if exchange is None:
            exchange = EXCHANGE.get()
            if exchange is None:
                return await connect(req, traces, timeout)
        # The connect in the wire turn's try: a request's path pays for no try of its own.
        # "Never connected" is told by the name left unbound (UnboundLocalError
        # below), not by a `connection = None` set first, or a try of the connect's
        # own: either costs every request two bytecodes more (``overhead.py
        # --bytecodes``), and only a failed connect reads the difference.
        try:  # a wire turn given up (cancelled, past max_wait, a store's fault): no connection kept
            connection = await connect(req, traces, timeout)
            if (wait := exchange.wire_now()) > 0.0:
                if wait > HOLD_FOR_WIRE:
                    connection, wait = await _wire_without_holding(
                        exchange, connection, wait, lambda: connect(req, traces, timeout)
                    )
                await exchange.on_wire(wait)
        except BaseException:
            try:
                connection.close()  # a no-op on one handed back to the connector meanwhile
            except UnboundLocalError:  # never made (refused, timed out, cancelled): nothing went
                exchange.unconnected()
            raise
        return connection

    connector.connect = connect_then_wire  # type: ignore[method-assign]
    _HOOKED_CONNECTORS.add(connector)


#: The longest wait for the wire turn a request makes holding its connection.
HOLD_FOR_WIRE = 0.05


async def _wire_without_holding(
    exchange: Exchange,
    connection: Connection,
    wait: float,
    connect: Callable[[], Awaitable[Connection]],
) -> tuple[Connection, float]:
    """Wait out a long wire turn with the connection handed back to the connector.

    A turn granted before a pause (a ``Retry-After`` of another request of the
    slot) or far ahead may wait seconds for the wire. Holding the connection
    meanwhile holds one of the connector's ``limit`` connections (100 by
    default): a crawl of thousands of hosts then fills it with requests that
    are only waiting, and aiohttp wakes the ones waiting for a connection in
    time proportional to the hosts waiting. Handed back, the connection stays
    in the connector's pool, idle, and is usually taken again at once.
    Returns the connection to send on and the wait still left (short).
    """
    while wait > HOLD_FOR_WIRE:
        exchange.within_bound(wait)  # a pause past the request's bound is not waited out
        connection.release()
        started = perf_counter()
        await asyncio.sleep(wait)
        exchange.waited += perf_counter() - started
        connection = await connect()
        try:
            wait = exchange.wire_now()
        except BaseException:
            connection.close()
            raise
    return connection, wait


def hook_request_options(session: ClientSession) -> None:
    """Read ``trace_request_ctx`` options where the session takes them, for the middleware.

    What :func:`throttle_trace_config` does, without a TraceConfig: with any
    trace config at all, aiohttp builds the parameters of, and awaits, every
    signal of every request (about 14 µs a request, ``docs/benchmarks.md``).
    This gives the session its own request methods instead (``get``,
    ``post``, ... and ``request``, which ``ws_connect`` uses), each calling
    aiohttp's ``_request`` as aiohttp's own does: a request without
    ``trace_request_ctx`` goes on untouched, unless it is made from inside
    another (a middleware's own request), where the outer options must not
    leak into it. A wrapper around ``_request`` would do the same, but
    passing every keyword on costs a request about 2.5k instructions; that
    wrapper stays for a caller of ``_request`` itself.
    """
    send = session._request  # noqa: SLF001 (aiohttp's one entry of every request method)

    def request(*args: Any, **kwargs: Any) -> Any:
        ctx = kwargs.get("trace_request_ctx")
        if ctx is None and (not OPTIONS_SET[0] or REQUEST.get() is None):
            return send(*args, **kwargs)
        return _request_with_options(send, ctx, args, kwargs)

    # Past aiohttp's warning about setting attributes (in its debug mode): the
    # session is ours, made by ThrottledSession.
    object.__setattr__(session, "_request", request)
    methods = {
        "request": _any_method(send),
        "get": _method_with_redirects(send, hdrs.METH_GET, True),
        "options": _method_with_redirects(send, hdrs.METH_OPTIONS, True),
        "head": _method_with_redirects(send, hdrs.METH_HEAD, False),
        "post": _method_with_data(send, hdrs.METH_POST),
        "put": _method_with_data(send, hdrs.METH_PUT),
        "patch": _method_with_data(send, hdrs.METH_PATCH),
        "delete": _method(send, hdrs.METH_DELETE),
    }
    for name, method in methods.items():
        object.__setattr__(session, name, method)


_Send = Callable[..., Coroutine[Any, Any, ClientResponse]]
"""The session's ``_request``."""


def _any_method(send: _Send) -> Callable[..., _RequestContextManager]:
    """``session.request(method, url, **kwargs)``."""

    def request(method: str, url: Any, **kwargs: Any) -> _RequestContextManager:
        if "trace_request_ctx" in kwargs or (OPTIONS_SET[0] and REQUEST.get() is not None):
            return _RequestContextManager(_with_options(send, method, url, kwargs))
        return _RequestContextManager(send(method, url, **kwargs))

    return request


def _method_with_redirects(
    send: _Send, verb: str, follow: bool
) -> Callable[..., _RequestContextManager]:
    """``session.get`` (``options``, ``head``): redirects followed by default or not."""

    def method(
        url: Any, *, allow_redirects: bool = follow, **kwargs: Any
    ) -> _RequestContextManager:
        if "trace_request_ctx" in kwargs or (OPTIONS_SET[0] and REQUEST.get() is not None):
            kwargs["allow_redirects"] = allow_redirects
            return _RequestContextManager(_with_options(send, verb, url, kwargs))
        return _RequestContextManager(send(verb, url, allow_redirects=allow_redirects, **kwargs))

    return method


def _method_with_data(send: _Send, verb: str) -> Callable[..., _RequestContextManager]:
    """``session.post`` (``put``, ``patch``)."""

    def method(url: Any, *, data: Any = None, **kwargs: Any) -> _RequestContextManager:
        if "trace_request_ctx" in kwargs or (OPTIONS_SET[0] and REQUEST.get() is not None):
            kwargs["data"] = data
            return _RequestContextManager(_with_options(send, verb, url, kwargs))
        return _RequestContextManager(send(verb, url, data=data, **kwargs))

    return method


def _method(send: _Send, verb: str) -> Callable[..., _RequestContextManager]:
    """``session.delete``."""

    def method(url: Any, **kwargs: Any) -> _RequestContextManager:
        if "trace_request_ctx" in kwargs or (OPTIONS_SET[0] and REQUEST.get() is not None):
            return _RequestContextManager(_with_options(send, verb, url, kwargs))
        return _RequestContextManager(send(verb, url, **kwargs))

    return method


def _with_options(
    send: _Send, verb: str, url: Any, kwargs: dict[str, Any]
) -> Coroutine[Any, Any, ClientResponse]:
    return _request_with_options(send, kwargs.get("trace_request_ctx"), (verb, url), kwargs)


async def _request_with_options(
    send: Callable[..., Awaitable[ClientResponse]],
    ctx: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> ClientResponse:
    state, token = _enter_request(ctx, None)
    try:
        return await send(*args, **kwargs)
    finally:
        state.done = True
        REQUEST.reset(token)


# -- holding the slot until the response is finished --------------------------------


_HELD = "_autothrottle_held"
"""The attribute of a connection's protocol that holds the :class:`Watch` of the
response reading from it now (in a one-item list): the protocol's ``closed``
future has one callback that releases it, registered with the list the first
time a response holds on the connection. One callback a connection, not one
added and removed a response: a pooled connection serves one response at a
time, and a watch released already does nothing when released again."""


def _on_lost(held: list[Watch], closed: asyncio.Future[None]) -> None:
    """The connection was lost: its response's body will never finish."""
    if not closed.cancelled():
        closed.exception()  # seen here; keeps asyncio from logging it
    held[0].release()


def _watch_connection(protocol: object, closed: asyncio.Future[None], hold: Watch) -> None:
    """Release ``hold`` if the connection (watched for the first time) is lost
    before its body is finished."""
    held = [hold]
    try:
        setattr(protocol, _HELD, held)
    except AttributeError:  # a protocol with no room for it: hold_timeout bounds a lost one
        return
    closed.add_done_callback(functools.partial(_on_lost, held))


def _unpin(response: ClientResponse, hold: Watch) -> None:
    """Let a response that its caller dropped unread be collected.

    aiohttp registers the response's own end-of-body callback on its body
    stream, which the connection keeps alive, so a dropped response lives as
    long as its stalled connection and its lease until ``hold_timeout``.
    Calling that callback through ``hold`` (a weak reference to the response)
    lets the response be collected; aiohttp then releases its connection,
    which releases the hold. If aiohttp's internals differ from what is
    expected here, nothing changes.
    """
    callbacks = getattr(getattr(response, "content", None), "_eof_callbacks", None)
    if not isinstance(callbacks, list):
        return
    for index, callback in enumerate(callbacks):
        if getattr(callback, "__self__", None) is response:
            callbacks[index] = functools.partial(_call_weakly, callback.__func__, hold)


def _call_weakly(function: Callable[[Any], None], target: weakref.ref[Any]) -> None:
    """``function(target())``, or nothing once the target is gone: a bound
    method held weakly (``weakref.WeakMethod`` costs several times as much)."""
    self = target()
    if self is not None:
        function(self)


def hold_until_finished(response: ClientResponse, lease: Lease) -> None:
    """Hold ``lease`` until the body of ``response`` is finished.

    aiohttp releases (or closes) a response's connection when the body has
    arrived to the end, when the response is released or closed, and when a
    never-closed response is collected: the hold is released with it. Two
    backstops: the connection being lost mid-body (server gone, session
    closed), and the exchange's :func:`~autothrottle._hold.watch` (the
    hold), which releases a response collected without reaching its
    connection. The throttle's ``hold_timeout`` bounds everything else.
    """
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
    hold = watch(response, lease)
    connection.add_callback(hold.release)
    if closed is not None:
        held: list[Watch] | None = getattr(protocol, _HELD, None)
        if held is not None:  # the usual pooled connection: watched already
            held[0] = hold
        else:
            _watch_connection(protocol, closed, hold)
    _unpin(response, hold)
