"""One request's exchange with its slot: the lifecycle every adapter shares.

The adapters (httpx async and sync, aiohttp) differ only in how they hook
into their client. What happens to a request is decided here, once; the
rules are written down in ``docs/adapters.md`` ("The request lifecycle"):

1. **Turn.** The request waits for its slot's turn (FIFO, cap, delay) before
   it is handed to the client, so waiting requests never fill the pool.
2. **Wire.** When its connection is ready, just before the request headers
   are written, it takes its turn on the wire (:meth:`Exchange.on_wire`): the
   host sees the spacing the slot granted, however long the request waited
   for a connection. Latency starts after that.
3. **Failure.** An error from sending is the host's failure only when the
   client says the host failed (refused, reset, timed out, broke the
   protocol); the slot records it and may back off. Any other error (the
   caller's own: a bad URL, a raising callback) and cancellation only release.
4. **Response.** Every response the client accepts is observed, whatever its
   status. Latency is connection ready to response headers, or, when the
   client gave no connection event (a mock), handed over to headers. If
   observing raises (a user's classifier), the slot is released, the caller
   closes the response, and the error propagates.
5. **Release.** When the body is finished or the response closed, its
   connection lost, or the response dropped unread (``_hold.watch``);
   ``hold_timeout`` bounds anything else.

That order is written once, in :func:`paced` (and :func:`paced_blocking` for
a thread): turn, wire, send, failure or response, hold. An adapter plugs in
only what differs between clients (a :class:`Plug`): how the wire turn finds
the request being sent, which errors are the host's, how a response is read,
closed and held until its body is finished. One copy: aiohttp's middleware
is :func:`paced` with its plug's steps written in (four calls fewer a
request), held to it by a test that sends the same requests through both.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Generic, NoReturn, TypeVar

import anyio

from ._errors import ThrottleTimeout
from ._fleet_hooks import never_sent
from ._lease import Lease
from ._request import RequestOptions
from ._throttle import Throttle
from ._turns import Turns

__all__ = [
    "Exchange",
    "HostFailure",
    "Plug",
    "ThrottleInfo",
    "free_exchange",
    "paced",
    "paced_blocking",
    "send_failed",
    "wait_turn",
]

HostFailure = Callable[[BaseException], bool]
"""Says whether an error from the client means the host failed (rule 3)."""


@dataclass(frozen=True, slots=True)
class ThrottleInfo:
    """What the throttle did to one request, for its caller.

    httpx puts it on ``response.extensions["autothrottle"]``; under aiohttp,
    ``autothrottle.aiohttp.throttle_info(response)`` returns it.

    Attributes:
        slot: The slot key the request was paced on.
        waited: Seconds it waited for its turn and its wire turn together.
        sent_at: When it was granted, on the throttle's clock: pass it to
            ``Throttle.backoff(url, sent_at=...)`` so only the first signal
            of a burst counts.
        adjusted: Whether its response may change the slot's delay.
    """

    slot: str
    waited: float
    sent_at: float
    adjusted: bool


_new_object = object.__new__
_set_slot = vars(ThrottleInfo)["slot"].__set__
_set_waited = vars(ThrottleInfo)["waited"].__set__
_set_sent_at = vars(ThrottleInfo)["sent_at"].__set__
_set_adjusted = vars(ThrottleInfo)["adjusted"].__set__
_MODULES = sys.modules


class Exchange:
    """One request's lease and timing, from its turn to its response."""

    __slots__ = ("asked", "bound", "key", "lease", "started", "waited", "wire_error", "wired")

    #: The request's own bound on its wait (its ``max_wait``, or the httpx pool
    #: timeout the user set), when it has one. Set only then (read with
    #: ``getattr``): the wire turn's wait counts against it too
    #: (:meth:`within_bound`).
    bound: float
    #: When the request asked for its turn (``perf_counter``), noted by
    #: :meth:`within_bound` at the first wait for the wire, before that wait
    #: is added to ``waited``; read with ``getattr``.
    asked: float

    #: What the wire turn raised (the fleet's bound, its store): the throttle's
    #: own error, never the host's, whatever the client wraps it in. Set only
    #: then (read with ``getattr``): the usual request pays nothing for it.
    wire_error: Exception

    def __init__(
        self, lease: Lease, asked: float, key: str | None = None, free: bool = False
    ) -> None:
        self.lease = lease
        self.key = key  # the slot's key, when the caller has it: saves two calls
        # When the latency clock starts: the request handed over, until the
        # connection is ready (the wire turn moves it there: rule 4).
        if free:  # a free turn (granted as it was asked) waited nothing: no clock read
            self.started = asked
            self.waited = 0.0
        else:
            self.started = started = perf_counter()
            self.waited = started - asked
        self.wired = False
        if "opentelemetry.trace" in _MODULES:  # only if the caller traces
            _note_on_span(self)

    @property
    def ready(self) -> float | None:
        """When the connection was ready (the latency clock's start), or None
        before the wire turn."""
        return self.started if self.wired else None

    def info(self) -> ThrottleInfo:
        """What the throttle did to this request (made anew when asked for: each
        caller asks once, and a cache would cost every request its field)."""
        # ThrottleInfo(...), the same object at half the cost: a frozen
        # dataclass's __init__ sets each field through object.__setattr__.
        info = _new_object(ThrottleInfo)
        key = self.key
        _set_slot(info, key if key is not None else self.lease.slot.key)
        _set_waited(info, self.waited)
        lease = self.lease
        _set_sent_at(info, lease.sent_at)
        _set_adjusted(info, lease.adjust)
        return info

    def wire_now(self) -> float:
        """The connection is ready: take the wire turn if it is now and start the
        latency clock (0.0), or say how long to wait (pass it to :meth:`on_wire`).

        Most requests find their wire turn free: this spares them a coroutine.
        A lease with no fleet's check to ask first (``Lease.on_wire``: every
        lease of a throttle whose store is not shared) is passed to its gate's
        wire turn here, as :meth:`Lease.wire_wait` would pass it, without that
        call between (on every request); a lease with one goes its way.
        """
        if self.wired:
            self.started = perf_counter()
            return 0.0
        lease = self.lease
        try:
            wait = (
                lease._live.gate.wire_wait(lease)  # noqa: SLF001 (Lease.wire_wait's step)
                if lease.on_wire is None
                else lease.wire_wait()
            )
        except Exception as error:
            self.wire_error = error
            raise
        if wait <= 0.0:
            self.wired = True
            self.started = perf_counter()
        return wait

    async def on_wire(self, wait: float | None = None) -> None:
        """The connection is ready: wait for the wire turn, then start the latency clock.

        ``wait``: what :meth:`wire_now` just answered, if it was asked first.
        Cancelled meanwhile, the request was never written: a fleet's turn it
        holds goes back whole (``_fleet_hooks.never_sent``), even one the fleet
        let go before the slot's own gate held the request here.
        """
        if not self.wired:
            started = perf_counter()
            try:
                if wait is None:
                    wait = self.lease.wire_wait()
                if wait > 0.0:  # (the same test as the loop's first: the usual path pays none)
                    while wait > 0.0:  # woken on time, or asked again after someone else went
                        self.within_bound(wait)
                        await anyio.sleep(wait)
                        wait = self.lease.wire_wait()
                    if "opentelemetry.trace" in _MODULES:  # the span's wait, this one's too
                        _note_on_span(self, perf_counter() - started)
            except Exception as error:
                self.wire_error = error
                raise
            except BaseException:  # cancelled before its wire turn: nothing of it was written
                never_sent(self.lease)
                raise
            self.wired = True
            self.started = ready = perf_counter()
            self.waited += ready - started
        else:
            self.started = perf_counter()

    def on_wire_blocking(self, wait: float | None = None) -> None:
        """:meth:`on_wire` for a thread."""
        if not self.wired:
            started = perf_counter()
            try:
                if wait is None:
                    wait = self.lease.wire_wait()
                if wait > 0.0:
                    while wait > 0.0:
                        self.within_bound(wait)
                        time.sleep(wait)
                        wait = self.lease.wire_wait()
                    if "opentelemetry.trace" in _MODULES:
                        _note_on_span(self, perf_counter() - started)
            except Exception as error:
                self.wire_error = error
                raise
            except BaseException:  # interrupted before its wire turn: nothing was written
                never_sent(self.lease)
                raise
            self.wired = True
            self.started = ready = perf_counter()
            self.waited += ready - started
        else:
            self.started = perf_counter()

    def within_bound(self, wait: float) -> None:
        """Raise :class:`ThrottleTimeout` if waiting ``wait`` more seconds for the
        wire turn would pass the request's bound, counted from when it asked
        for its turn: a ``max_wait`` bounds the whole wait before a byte is
        written, not only the wait for the turn. A granted request still waits
        here for the wire's spacing, or for a pause that began after its grant
        (a 429's ``Retry-After`` on another request while this one waited for a
        connection); that pause may be far longer than the bound. Raised at
        once, not after waiting: the wait is known. Nothing of the request was
        written; the caller's failure path (:meth:`failed`) releases its lease
        and hands the caller this error as a turn past its bound."""
        asked: float | None = getattr(self, "asked", None)
        if asked is None:  # the first wait for the wire: ``waited`` is the turn's alone
            self.asked = asked = self.started - self.waited
        slot = self.lease.slot
        bound = Turns.bound(slot, getattr(self, "bound", None))
        if bound is not None and perf_counter() + wait - asked > bound:
            # The throttle's own error, whatever the client wraps it in (aiohttp's
            # connect makes it a ConnectionTimeoutError): told apart by failed().
            self.wire_error = error = ThrottleTimeout(slot.key, bound)
            raise error

    def failed(
        self,
        error: BaseException,
        host_failure: HostFailure,
        unconnected: HostFailure | None = None,
        *,
        wired_before_connect: bool = False,
    ) -> Exception | None:
        """Sending raised ``error``: record it if the host failed, and release.

        Returns what the wire turn raised, if it did (:attr:`wire_error`): then
        nothing was sent, and ``error`` is that or the client's wrapping of it
        (aiohttp makes a ``TimeoutError`` raised inside its connect a
        ``ConnectionTimeoutError``), not the host's failure.

        ``unconnected`` says whether ``error`` shows that nothing of the request
        was written: a connection never made (refused, a connect timeout), or a
        cancellation (not an ``Exception``) while it was being made or waited
        for. Then nothing reached the host, and a fleet's turn goes back whole
        (``_fleet_hooks.never_sent``), the one place that rule is applied. It
        is asked only before the wire turn, after which the request may have
        been written, unless ``wired_before_connect``: the adapter takes the
        wire turn before its client connects, knowing nothing of the
        connection (Scrapy), so the wire turn says nothing of what was written
        and ``unconnected`` alone decides.
        """
        wired: Exception | None = getattr(self, "wire_error", None)
        if wired is not None:
            del self.wire_error  # its frames refer to this exchange: no cycle kept
        lease = self.lease
        try:
            if (
                lease.on_release is not None  # a fleet's lease (the only ones with a hook)
                and wired is None
                and unconnected is not None
                and (wired_before_connect or not self.wired)
                and unconnected(error)
            ):
                never_sent(lease)
            if wired is None and isinstance(error, Exception) and host_failure(error):
                lease.fail(error)
        finally:
            lease.release()
        return wired

    def unconnected(self) -> None:
        """The request's connection was never made (its client's connect raised, or
        was cancelled, before the wire turn): a fleet's turn it holds goes back
        whole at its release (``_fleet_hooks.never_sent``). After the wire turn,
        nothing changes: the request may have been written."""
        if not self.wired:
            never_sent(self.lease)

    def responded(
        self,
        status: int,
        headers: Mapping[str, str],
        headers_at: float | None = None,
        *,
        from_cache: bool = False,
        latency: float | None = None,
        finished: bool = False,
    ) -> None:
        """Observe the response (its headers arrived at ``headers_at``, default now).

        ``from_cache``: a client-side cache below the throttle answered; the
        response then teaches nothing, as a cache header would say.
        ``latency``: the client timed the exchange itself (Scrapy's
        ``download_latency``); it is taken as is, and ``headers_at`` ignored.
        ``finished``: the response is finished already (its body came with its
        headers): the lease is released in the same step (:meth:`Lease.finish`).
        On an error the lease is released and the error raised: the caller
        must close the response, which nobody else will.
        """
        if latency is None:
            end = perf_counter() if headers_at is None else headers_at
            latency = end - self.started
            if not latency > 0.0:  # max(latency, 0.0), without its call
                latency = 0.0
        lease = self.lease
        try:
            if finished:
                lease.finish(latency, status, headers, from_cache or None)
            else:
                lease.observe(latency, status, headers, from_cache or None)
        except BaseException:
            lease.release()
            raise


def release_unsent(lease: Lease) -> None:
    """Nothing of the request was sent (its wiring raised, before its client
    had it): release ``lease``, no failure counted, and a fleet's turn it
    holds goes back whole, its time too (``_fleet_hooks.never_sent``)."""
    never_sent(lease)
    lease.release()


def free_exchange(lease: Lease, asked: float, key: str) -> Exchange:
    """``Exchange(lease, asked, key, True)``, the same object, for a free turn
    (granted as it was asked: most requests): calling a class runs its
    ``__init__`` through the type, a call that Python 3.11 does not inline as
    it does a function's (``_lease.lease_at`` is made the same way). The
    fields are :meth:`Exchange.__init__`'s (a test compares the two)."""
    exchange: Exchange = _new_object(Exchange)
    exchange.lease = lease
    exchange.key = key
    exchange.started = asked  # a free turn waited nothing: no clock read
    exchange.waited = 0.0
    exchange.wired = False
    if "opentelemetry.trace" in _MODULES:  # only if the caller traces
        _note_on_span(exchange)
    return exchange


Request = TypeVar("Request")
Response = TypeVar("Response")
Wiring = TypeVar("Wiring")


class Plug(Generic[Request, Response, Wiring]):
    """What one adapter plugs into the request skeleton (:func:`paced`).

    The skeleton decides the order; a plug says how its client does each
    step. One plug serves every request of its adapter (it keeps no state of
    a request: what a request needs between steps is its ``Wiring``).
    """

    __slots__ = ()

    def host_failure(self, error: BaseException) -> bool:
        """Whether ``error`` from sending means the host failed (rule 3)."""
        raise NotImplementedError

    def unconnected(self, error: BaseException) -> bool:
        """Whether ``error``, raised before the wire turn, says the request's
        connection was never made (refused, a connect timeout, a name not
        found): nothing of the request reached the host (a fleet's turn goes
        back whole, :meth:`Exchange.failed`). False when the client cannot tell.

        Also asked of a cancellation or an interrupt (not an ``Exception``)
        that came before the wire turn: True when the client writes nothing
        of a request before it, wherever it was (connecting, or queued for a
        connection in the client's own pool, where it reports nothing)."""
        return False

    def timed_out(self, error: ThrottleTimeout, request: Request) -> BaseException:
        """The error to raise when the turn did not come in time: ``error`` itself,
        or the client's own kind of timeout made from it."""
        return error

    def wire(self, exchange: Exchange, request: Request) -> Wiring:
        """Just before sending: let the client's connection hook find ``exchange``
        (rule 2); what is returned is handed to :meth:`unwire` (unless it is
        None: nothing to undo) and :meth:`respond`."""
        raise NotImplementedError

    def unwire(self, request: Request, wiring: Wiring) -> None:
        """Sending is over (answered, failed or cancelled): undo :meth:`wire`
        (not called when it returned None)."""
        raise NotImplementedError

    def respond(self, exchange: Exchange, response: Response, wiring: Wiring) -> Response:
        """Read ``response`` into :meth:`Exchange.responded` (rule 4), then hold
        the lease until its body is finished (rule 5); return the response to
        hand to the caller. One step, not two: a call fewer per request."""
        raise NotImplementedError

    async def aclose(self, response: Response) -> None:
        """Close ``response`` (observing it failed; the caller will never see it)."""
        self.close(response)

    def close(self, response: Response) -> None:
        """:meth:`aclose` for a thread."""
        raise NotImplementedError


async def paced(
    plug: Plug[Request, Response, Any],
    throttle: Throttle,
    key: str,
    options: RequestOptions,
    bound: float | None,
    send: Callable[[Request], Awaitable[Response]],
    request: Request,
) -> Response:
    """The request skeleton: wait for the turn of slot ``key`` (at most
    ``bound`` seconds), send ``request`` with ``send``, observe the response
    and hold the lease until its body is finished. Whatever fails or is
    cancelled on the way releases the lease (``docs/adapters.md``).

    ``send`` is called right after ``plug.wire``, with no await between: the
    async httpx pools keep the wiring of the one request being handed over
    in a field of their own until their ``send`` takes it, so an await there
    would let another request's wiring take its place."""
    asked = perf_counter()
    # A free turn without a coroutine; any other waits in the queue.
    lease = throttle.acquire_now(key, options.adjust, bound, options.cost)
    if lease is None:
        lease = await wait_turn(plug, throttle, key, options, bound, request)
        exchange = Exchange(lease, asked, key)
    else:
        exchange = free_exchange(lease, asked, key)
    if bound is not None:  # the wire turn's wait counts against it too
        exchange.bound = bound
    try:
        wiring = plug.wire(exchange, request)
    except BaseException:
        release_unsent(lease)  # nothing was sent: released, no failure counted
        raise
    try:
        response = await send(request)
    except BaseException as error:
        send_failed(plug, exchange, error, request)
        raise
    finally:
        if wiring is not None:  # None: nothing to undo, and no call for it
            plug.unwire(request, wiring)
    try:
        return plug.respond(exchange, response, wiring)
    except BaseException:
        exchange.lease.release()  # released already if observing raised
        await plug.aclose(response)
        raise


async def wait_turn(
    plug: Plug[Request, Any, Any],
    throttle: Throttle,
    key: str,
    options: RequestOptions,
    bound: float | None,
    request: Request,
) -> Lease:
    """:func:`paced`'s turn when it is not free: wait for it in the queue (at
    most ``bound`` seconds; past it, the plug's kind of timeout)."""
    try:
        return await throttle.acquire(key, adjust=options.adjust, max_wait=bound, cost=options.cost)
    except ThrottleTimeout as error:
        _raise_timed_out(plug, error, request)


def paced_blocking(
    plug: Plug[Request, Response, Any],
    throttle: Throttle,
    key: str,
    options: RequestOptions,
    bound: float | None,
    send: Callable[[Request], Response],
    request: Request,
) -> Response:
    """:func:`paced` for a thread: the same steps in the same order."""
    asked = perf_counter()
    try:
        lease = throttle.acquire_blocking(
            key, adjust=options.adjust, max_wait=bound, cost=options.cost
        )
    except ThrottleTimeout as error:
        _raise_timed_out(plug, error, request)
    exchange = Exchange(lease, asked, key)
    if bound is not None:  # the wire turn's wait counts against it too
        exchange.bound = bound
    try:
        wiring = plug.wire(exchange, request)
    except BaseException:
        release_unsent(lease)  # nothing was sent: released, no failure counted
        raise
    try:
        response = send(request)
    except BaseException as error:
        send_failed(plug, exchange, error, request)
        raise
    finally:
        if wiring is not None:
            plug.unwire(request, wiring)
    try:
        return plug.respond(exchange, response, wiring)
    except BaseException:
        exchange.lease.release()  # released already if observing raised
        plug.close(response)
        raise


def _raise_timed_out(
    plug: Plug[Request, Any, Any], error: ThrottleTimeout, request: Request
) -> NoReturn:
    """Raise the plug's kind of timeout for a turn that did not come in time.

    The traceback keeps this frame: its locals are let go as the error leaves,
    or the error would refer to itself through them, a cycle that keeps the
    request and its frames until the garbage collector finds them.
    """
    raised = plug.timed_out(error, request)
    try:
        if raised is error:
            raise error
        raise raised from error
    finally:
        del raised, error


def send_failed(
    plug: Plug[Request, Any, Any], exchange: Exchange, error: BaseException, request: Request
) -> None:
    """Sending raised ``error``: record it if the host failed, and release
    (:meth:`Exchange.failed`). If the wire turn raised it, raise what the
    caller sees of that (:func:`raise_wire_error`); else return, and the caller
    raises ``error`` as it is."""
    wired = exchange.failed(error, plug.host_failure, plug.unconnected)
    if wired is not None:
        try:
            raise_wire_error(plug, wired, request)
        finally:
            del wired, error  # as in _raise_timed_out


def raise_wire_error(plug: Plug[Request, Any, Any], error: Exception, request: Request) -> NoReturn:
    """Raise what the caller sees of an error the wire turn raised: a turn past
    ``max_wait`` (a fleet's new turn at the wire, ``_fleet_wire.WireCheck``) as one
    past it at the turn (the plug's kind of timeout); anything else as raised."""
    if isinstance(error, ThrottleTimeout):
        _raise_timed_out(plug, error, request)
    try:
        raise error
    finally:
        del error  # as in _raise_timed_out


def _note_on_span(exchange: Exchange, at_wire: float = 0.0) -> None:
    """Put the throttle's wait on the caller's active OpenTelemetry span.

    An HTTP client span around a throttled request also times the wait for
    the turn; the attributes say how much of it was the throttle's. Noted at
    the grant, and again, ``at_wire`` seconds more, after a wait for the wire
    turn (the same total as :attr:`ThrottleInfo.waited`).
    """
    trace = sys.modules["opentelemetry.trace"]
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("autothrottle.slot", exchange.lease.slot.key)
        span.set_attribute("autothrottle.wait_s", exchange.waited + at_wire)
