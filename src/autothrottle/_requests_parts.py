"""What the requests adapter puts inside urllib3: the wire turn and the latency clock
on its connections, a turn for each attempt urllib3's ``Retry`` makes, and the
response that holds the slot until its body is finished."""

from __future__ import annotations

import contextvars
import http.client
import io
import sys
import threading
from collections.abc import Iterable, Iterator
from time import perf_counter
from typing import Any, cast

import urllib3
import urllib3.connection
from urllib3.response import HTTPResponse
from urllib3.util.request import body_to_chunks
from urllib3.util.retry import Retry
from urllib3.util.ssl_match_hostname import CertificateError

from ._exchange import Exchange, Plug
from ._lease import Lease
from ._request import RequestOptions
from ._throttle import Throttle

__all__ = [
    "SENDING",
    "Attempts",
    "Timing",
    "hold_until_finished",
    "pool_classes",
    "retries_possible",
]


# -- the wire turn and the latency clock, inside urllib3 -----------------------------


class Timing:
    """One request's exchange, when its response headers were parsed, and the
    token that takes it off :data:`SENDING` once sent."""

    __slots__ = ("attempts", "body_raised", "end", "exchange", "token")

    token: contextvars.Token[Timing | None]
    #: Set (True) when the request's body raised as it was sent
    #: (:func:`callers_body`): its failure is then the caller's. Read with
    #: ``getattr``: the usual request never sets it.
    body_raised: bool
    #: Set when urllib3 may retry the request (:class:`Attempts`); read with
    #: ``getattr``, by the retrying pools only.
    attempts: Attempts

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.end: float | None = None


# The request this thread is sending: set by the adapter around urllib3's
# ``urlopen``, read by the connection when it writes the request.
SENDING: contextvars.ContextVar[Timing | None] = contextvars.ContextVar(
    "autothrottle_requests_sending", default=None
)


class _WireTurn:
    """A urllib3 connection that takes the wire turn once it is ready.

    ``request`` is where urllib3 writes a request on a connection, new or
    pooled; a new one connects first (as http.client would a moment later), so
    the turn and the latency clock start on a ready connection. An attempt
    urllib3 retries comes back here with a turn of its own (:class:`Attempts`).
    """

    sock: Any

    def request(self, *args: Any, **kwargs: Any) -> None:
        timing = SENDING.get()
        if timing is not None:
            body = kwargs.get("body")  # urllib3 passes it by name
            if body is not None and not isinstance(body, (bytes, str)):
                method = args[0] if args else kwargs["method"]
                chunks = callers_body(body, method, self.blocksize, timing)  # type: ignore[attr-defined]
                if chunks is not None:
                    kwargs["body"] = chunks
            if self.sock is None:
                self.connect()
            timing.exchange.on_wire_blocking()
            timing.end = None
        super().request(*args, **kwargs)  # type: ignore[misc]

    def connect(self) -> None:
        """urllib3's connect (called from :meth:`request` for a new plain connection,
        and by urllib3's pool first for a new HTTPS one), noting an interrupt
        (``KeyboardInterrupt``, ``SystemExit``) that stops it: raised before the
        wire turn, nothing of the request reached the host, and a fleet's turn
        goes back whole (``Exchange.unconnected``), as it does for a connection
        refused. An error of the connect itself is urllib3's to wrap; the
        adapter reads it from there (``NewConnectionError``, ``ConnectTimeout``)."""
        try:
            super().connect()  # type: ignore[misc]
        except Exception:
            raise
        except BaseException:
            timing = SENDING.get()
            if timing is not None:
                timing.exchange.unconnected()
            raise

    def getresponse(self) -> HTTPResponse:
        response: HTTPResponse = super().getresponse()  # type: ignore[misc]
        timing = SENDING.get()
        if timing is not None:
            timing.end = perf_counter()
        return response


def callers_body(body: Any, method: str, blocksize: int, timing: Timing) -> Iterator[bytes] | None:
    """``body``'s chunks as urllib3 reads them (its own ``body_to_chunks``), noting
    on ``timing`` that reading it raised: the error is the caller's, never the
    host's it was sent to, though urllib3 hands an ``OSError`` on as a
    ``ProtocolError`` ("Connection aborted.") and requests as a
    ``ConnectionError`` (a body relaying another host's download raises
    that host's ``ConnectionError``s; a file, its disk's ``OSError``).

    None when urllib3 sends ``body`` as one buffer (it has a length): nothing
    of it is read as it goes. A body urllib3 refuses (neither bytes, a file
    nor an iterable) raises its ``TypeError`` here, before the connection
    and the wire turn: nothing of the request was sent.
    """
    try:
        chunks = body_to_chunks(body, method=method, blocksize=blocksize)
    except Exception:
        timing.body_raised = True
        timing.exchange.unconnected()
        raise
    if chunks.content_length is not None or chunks.chunks is None:
        return None
    return _marked(chunks.chunks, timing)


def _marked(chunks: Iterable[bytes], timing: Timing) -> Iterator[bytes]:
    try:
        yield from chunks
    except Exception:
        timing.body_raised = True
        raise


class _HTTPConnection(_WireTurn, urllib3.connection.HTTPConnection):  # type: ignore[misc]
    pass


class _HTTPSConnection(_WireTurn, urllib3.connection.HTTPSConnection):  # type: ignore[misc]
    pass


class _HTTPConnectionPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSConnectionPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


# -- a turn for each attempt urllib3's Retry makes -------------------------------------


def retries_possible(retries: Retry) -> bool:
    """Whether urllib3 may send a request again under ``retries`` (an adapter's
    ``max_retries``): not with a ``total`` of 0 (requests' default) or False."""
    return retries.total is None or retries.total > 0


class Attempts:
    """A request urllib3 may retry: each attempt takes a turn of its own, and each
    attempt urllib3 gives up on reaches the throttle as the last one would.

    urllib3 drives its ``Retry`` (which statuses and errors, how long to
    sleep, when to give up) inside its pool's ``urlopen``, which calls itself
    for every retry. The request's :class:`Exchange` is the current
    attempt's: an attempt urllib3 retries is read into it as the adapter
    reads the last one (``Exchange.responded``, ``Exchange.failed``), then
    the exchange is started again on a new turn, waited for in the slot's
    queue like any request. A retried response is read when urllib3 drains
    it, before its sleep: a ``Retry-After`` or a backoff is heard by the slot
    at once, and the turn is not held while urllib3 sleeps. An error is read
    as it leaves the pool's step that raised it (:meth:`raised`): its
    ``_make_request``, or its ``_prepare_proxy`` (an HTTPS request's tunnel
    through an HTTP proxy), before urllib3 decides to retry it and sleeps its
    backoff: the failure backs the slot off at once, and other threads'
    requests to the host go meanwhile. An error raised elsewhere (a urllib3
    release without those steps) is read when urllib3 calls ``urlopen``
    again (the last entry of the ``Retry``'s history): later, still once.

    ``settled``: the current attempt has been read and its lease let go; what
    the adapter then sees raised (urllib3 gave up, or the next turn did not
    come) is not the host's again: it was counted once already.
    """

    __slots__ = ("attempted", "key", "options", "plug", "settled", "throttle")

    def __init__(
        self, throttle: Throttle, key: str, options: RequestOptions, plug: Plug[Any, Any, Timing]
    ) -> None:
        self.throttle = throttle
        self.key = key
        self.options = options
        self.plug = plug
        self.attempted = False
        self.settled = False

    def attempt(self, timing: Timing, retries: Any) -> None:
        """urllib3 starts an attempt: the first one has the adapter's turn; a retry
        settles the one before (if its response did not) and takes a new turn."""
        if not self.attempted:
            self.attempted = True
            return
        exchange = timing.exchange
        if not self.settled:  # the last attempt raised, and urllib3 retries it
            history = retries.history if isinstance(retries, Retry) else ()
            wired = self._failed(timing, history[-1].error if history else None)
            if wired is not None:  # the throttle's own error (a fleet's wire turn): no more
                raise wired
        options = self.options
        asked = perf_counter()
        lease = self.throttle.acquire_blocking(
            self.key, adjust=options.adjust, max_wait=options.max_wait, cost=options.cost
        )
        Exchange.__init__(exchange, lease, asked, self.key)
        if getattr(exchange, "asked", None) is not None:  # the last attempt's wire wait's
            del exchange.asked  # this attempt's bound counts from its own ask
        timing.end = None
        self.settled = False

    def raised(self, timing: Timing, error: BaseException) -> None:
        """The current attempt's request raised ``error``, which urllib3 reads next
        (to retry it after its backoff, or to give up): read it now, and let
        its turn go, so that the slot's other requests are not kept waiting
        through urllib3's sleep. It is read as urllib3 reads it (an
        ``http.client`` error it wraps as a ``ProtocolError``), once: what the
        adapter then sees raised was counted already (``settled``).

        An error of the wire turn itself (the throttle's own: a bound, a
        fleet's store) only lets the turn go here; it is read where it was
        before, when urllib3 tries again or gives up, and raised as the
        throttle's."""
        if self.settled:
            return
        if getattr(timing.exchange, "wire_error", None) is not None:
            timing.exchange.lease.release()
            return
        if isinstance(error, CertificateError):
            error = urllib3.exceptions.SSLError(error)
        elif not isinstance(error, (OSError, urllib3.exceptions.HTTPError)):
            error = urllib3.exceptions.ProtocolError("Connection aborted.", error)
        self._failed(timing, error)

    def _failed(self, timing: Timing, error: BaseException | None) -> Exception | None:
        """Read the current attempt's ``error`` (None: unknown, only let go) and
        settle it; the wire turn's own error, if it raised one."""
        exchange = timing.exchange
        try:
            if error is None:
                exchange.lease.release()
                return None
            return exchange.failed(error, self.plug.host_failure, self.plug.unconnected)
        finally:
            self.settled = True
            if getattr(timing, "body_raised", False):  # that attempt's, not the next one's
                del timing.body_raised

    def answered(self, timing: Timing, response: HTTPResponse) -> None:
        """urllib3 drained ``response`` (the current attempt's) to retry the request,
        or to raise that its retries ran out: read it as any response, and let
        its turn go."""
        if self.settled:
            return
        self.settled = True
        timing.exchange.responded(response.status, response.headers, timing.end, finished=True)


class _RetryTurns:
    """A pool whose ``urlopen`` (called again by urllib3 for each retry) gives each
    attempt of a request with :class:`Attempts` its own turn."""

    def urlopen(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        timing = SENDING.get()
        attempts: Attempts | None = getattr(timing, "attempts", None)
        if attempts is not None:
            retries = args[2] if len(args) > 2 else kwargs.get("retries")
            attempts.attempt(cast("Timing", timing), retries)
        return super().urlopen(method, url, *args, **kwargs)  # type: ignore[misc]

    def _prepare_proxy(self, conn: Any) -> None:
        """urllib3's step that opens an HTTPS request's tunnel through an HTTP proxy
        (connect to the proxy, CONNECT, the TLS handshake through it), before
        ``_make_request``: an error it raises that urllib3 may retry is read
        before urllib3 sleeps its backoff, as one of ``_make_request``'s is."""
        try:
            super()._prepare_proxy(conn)  # type: ignore[misc]
        except _RETRIED as error:
            _raised(error)
            raise

    def _make_request(self, *args: Any, **kwargs: Any) -> Any:
        """urllib3's step that connects, writes and reads the headers: an error it
        raises that urllib3 may retry (:data:`_RETRIED`) is read before
        urllib3 sleeps its backoff (:meth:`Attempts.raised`)."""
        try:
            return super()._make_request(*args, **kwargs)  # type: ignore[misc]
        except _RETRIED as error:
            _raised(error)
            raise


def _raised(error: BaseException) -> None:
    """A step of urllib3's ``urlopen`` raised ``error``, which urllib3 hands to its
    ``Retry`` next: the request's :class:`Attempts` reads it now."""
    timing = SENDING.get()
    attempts: Attempts | None = getattr(timing, "attempts", None)
    if attempts is not None:
        attempts.raised(cast("Timing", timing), error)


_RETRIED = (
    urllib3.exceptions.TimeoutError,
    http.client.HTTPException,
    OSError,
    urllib3.exceptions.ProtocolError,
    urllib3.exceptions.SSLError,
    CertificateError,
    urllib3.exceptions.ProxyError,
)
"""The errors urllib3's ``urlopen`` hands to its ``Retry`` (to retry, or to
raise as it gives up): its own list (``ssl``'s errors are ``OSError`` s)."""


class _TriedResponse(HTTPResponse):
    """urllib3's response to an attempt it may retry: drained by urllib3, it is the
    attempt's answer (:meth:`Attempts.answered`)."""

    _autothrottle_timing: Timing

    def attempt_of(self, timing: Timing) -> None:
        """Say whose attempt this response answers."""
        self._autothrottle_timing = timing

    def drain_conn(self) -> None:
        try:
            super().drain_conn()
        finally:
            timing = self._autothrottle_timing
            timing.attempts.answered(timing, self)


class _RetryWireTurn(_WireTurn):
    """:class:`_WireTurn` for a pool whose requests urllib3 may retry: each
    response is one urllib3 may drain to retry (:class:`_TriedResponse`)."""

    def getresponse(self) -> HTTPResponse:
        response = super().getresponse()
        timing = SENDING.get()
        if (
            timing is not None
            and type(response) is HTTPResponse
            and getattr(timing, "attempts", None) is not None
        ):
            response.__class__ = _TriedResponse
            cast("_TriedResponse", response).attempt_of(timing)
        return response


class _RetryHTTPConnection(_RetryWireTurn, urllib3.connection.HTTPConnection):  # type: ignore[misc]
    pass


class _RetryHTTPSConnection(_RetryWireTurn, urllib3.connection.HTTPSConnection):  # type: ignore[misc]
    pass


class _RetryHTTPConnectionPool(_RetryTurns, urllib3.HTTPConnectionPool):
    ConnectionCls = _RetryHTTPConnection


class _RetryHTTPSConnectionPool(_RetryTurns, urllib3.HTTPSConnectionPool):
    ConnectionCls = _RetryHTTPSConnection


class _PoolWait:
    """A blocking pool (``pool_block=True``) whose wait for one of its connections
    is noted: a request given up there (``KeyboardInterrupt``, ``SystemExit``,
    urllib3's ``EmptyPoolError`` past a ``pool_timeout``, ``ClosedPoolError``)
    was never given a connection of this pool, whose connections are the
    adapter's own (:class:`_WireTurn`): nothing of it was written, and a
    fleet's turn goes back whole (``Exchange.unconnected``), its time too. A
    pool that does not block never waits there: it is not given this step."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        try:
            return super()._get_conn(timeout)  # type: ignore[misc]
        except BaseException:
            timing = SENDING.get()
            if timing is not None:
                timing.exchange.unconnected()
            raise


class _BlockingHTTPConnectionPool(_PoolWait, _HTTPConnectionPool):
    pass


class _BlockingHTTPSConnectionPool(_PoolWait, _HTTPSConnectionPool):
    pass


class _BlockingRetryHTTPConnectionPool(_PoolWait, _RetryHTTPConnectionPool):
    pass


class _BlockingRetryHTTPSConnectionPool(_PoolWait, _RetryHTTPSConnectionPool):
    pass


_POOL_CLASSES: dict[tuple[bool, bool], dict[str, type[urllib3.HTTPConnectionPool]]] = {
    (False, False): {"http": _HTTPConnectionPool, "https": _HTTPSConnectionPool},
    (True, False): {"http": _BlockingHTTPConnectionPool, "https": _BlockingHTTPSConnectionPool},
    (False, True): {"http": _RetryHTTPConnectionPool, "https": _RetryHTTPSConnectionPool},
    (True, True): {
        "http": _BlockingRetryHTTPConnectionPool,
        "https": _BlockingRetryHTTPSConnectionPool,
    },
}


def pool_classes(*, block: bool, retries: bool) -> dict[str, type[urllib3.HTTPConnectionPool]]:
    """The pools of an adapter made with ``pool_block=block``, whose requests
    urllib3 may retry (``retries``, :func:`retries_possible`) or not: a
    request it never retries pays nothing for :class:`Attempts`."""
    return _POOL_CLASSES[block, retries]


# -- holding the slot until the body is finished --------------------------------------


class _Hold:
    """Releases a lease once, when its response is finished or collected."""

    __slots__ = ("collected", "lease")

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.collected = False

    def finish(self) -> None:
        """Release the lease; for a collected response, from a thread of its own.

        Garbage collection may run inside the slot's own bookkeeping, on this
        very thread: the release thread waits its turn for the slot's lock.

        While the interpreter is finalizing (a response reachable only from a
        cycle, collected in the final collection) the lease is left: there,
        CPython 3.11 lets no new thread run, and ``Thread.start`` would wait
        for it forever, a process hung at exit; released inline instead, it
        could wait forever for a slot lock that a daemon thread, frozen
        mid-bookkeeping, still holds, or call on a Redis client whose modules
        are half torn down. The process is going away and its memory slots
        with it; a fleet's lease in Redis expires the throttle's
        ``hold_timeout`` after its send.
        """
        lease = self.lease
        if lease.released:
            return
        if not self.collected:
            lease.release()
            return
        if sys.is_finalizing():
            return
        try:
            threading.Thread(target=lease.release, name="autothrottle-release").start()
        except RuntimeError:  # no thread to be had (3.12+ refuses one at shutdown)
            lease.release()


class _LeaseResponse(HTTPResponse):
    """urllib3's response, releasing its request's lease once the body is finished.

    urllib3 calls ``release_conn`` when the body has been read to the end (and
    requests calls it when the response is closed); ``close`` covers a body
    abandoned half-read, and collection a response dropped unread.
    """

    _autothrottle_hold: _Hold

    def hold_until_finished(self, lease: Lease) -> None:
        """Keep ``lease`` until the body is read to its end, released or closed."""
        self._autothrottle_hold = _Hold(lease)

    def release_conn(self) -> None:
        try:
            super().release_conn()
        finally:
            self._autothrottle_hold.finish()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._autothrottle_hold.finish()

    def __del__(self) -> None:
        hold: _Hold | None = self.__dict__.get("_autothrottle_hold")
        if hold is not None:
            hold.collected = True
        io.IOBase.__del__(self)


_HELD_CLASSES = (HTTPResponse, _TriedResponse)


def hold_until_finished(raw: object, lease: Lease) -> None:
    if type(raw) not in _HELD_CLASSES or raw.closed:  # type: ignore[attr-defined]
        # Not urllib3's own response (a custom adapter below this one): there is
        # no finish to wait for, so the request is over once it was answered.
        lease.release()
        return
    raw.__class__ = _LeaseResponse
    cast("_LeaseResponse", raw).hold_until_finished(lease)
