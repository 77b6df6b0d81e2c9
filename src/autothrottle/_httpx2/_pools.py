# Generated from _httpx/_pools.py by scripts/unasync.py: edit that file and rerun.
"""The connection pools a throttled httpx2 client keeps per origin, shared by
the async and sync halves: one pool per origin, kept while its slot's pace
needs it and closed when it is idle past that, and the bound on how many
connections the client opens at once.

Why a pool per origin: httpcore2's one pool scans every idle connection on each
request, so a crawl over many hosts costs time quadratic in the hosts; a
table of small pools keyed by origin costs one lookup.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import anyio
import httpx2

from .._lease import Lease
from .._slot import Slot
from .._throttle import Throttle
from ._common import pool_bound

#: Put on a request being sent, for the per-origin pools: its slot, whose
#: pace says how long the origin's connection is worth keeping.
SLOT = "autothrottle.slot"


# -- a connection pool per origin ------------------------------------------------------

Origin = tuple[str, str, int | None]


def origin_of(url: httpx2.URL) -> Origin:
    """``url``'s origin, the key of its pool and of its :class:`Serial`: scheme,
    host and port (None for the scheme's default), the host as it goes on the
    wire (an international name encoded, ``xn--``), so that one origin is one key.

    Read from httpx2's parsed form where it has one: three attribute reads,
    where ``url.host`` decodes an international name at every call. Without
    it (an httpx2 other than the one this was written against), the public
    ``raw_host`` gives the same encoded name.
    """
    try:  # an attribute read; getattr's default would cost a call
        parsed = url._uri_reference  # noqa: SLF001
    except AttributeError:  # not the httpx2 this was written against
        return (url.scheme, url.raw_host.decode("ascii"), url.port)
    return (parsed.scheme, parsed.host, parsed.port)


class PooledOrigin:
    """One origin's connection pool, until when it is kept idle, and its requests being sent.

    ``core``: the transport's httpcore2 pool, whose own lists of connections
    and requests are read (its ``connections`` property copies the list on
    every read), or None for a transport that has no such pool.
    """

    __slots__ = ("core", "expires_at", "keep", "pool", "sending", "slot", "used_at")

    def __init__(self, pool: Any, now: float, keep: float) -> None:
        self.pool = pool
        self.keep = keep  # what the last sweep found its slot's pace asks for
        self.used_at = now
        self.expires_at = now + keep
        self.sending = 0
        self.slot: Slot | None = None  # whose pace says how long to keep it idle
        core = getattr(pool, "_pool", None)
        lists = (getattr(core, "_connections", None), getattr(core, "_requests", None))
        self.core = core if all(type(each) is list for each in lists) else None

    def opens_connection(self) -> bool:
        """Whether a request sent now through this pool opens a connection: none is idle.

        httpcore2 keeps a request in its list from the moment it is sent to
        the close of its response, and a connection it assigned to none is
        idle: as many requests as connections leave none idle (asking each
        connection costs two calls).
        """
        core = self.core
        if core is None:
            return opens_connection(self.pool)
        return len(core._requests) >= len(core._connections)  # noqa: SLF001 (httpcore2's own)


class Pools:
    """The pools of a client's origins, least recently used first.

    Thread-safe with ``threads`` (the sync client's): the lock guards the table and the making
    of a pool, which is cheap (about 70 us: it shares the client's SSL context), never a pool's
    requests or its closing. The async client's pools are used from its event loop's thread
    alone, as httpcore2's own async pool is, and never await inside the table: they take no lock
    (two acquisitions a request, about 3k instructions). A pool idle past its keep-alive is
    handed back to be closed. The keep-alive is ``expiry``, or the pace of the origin's slot
    when that is longer (times :attr:`PACE_MARGIN`), up to ``longest``: a host paced every 20 s
    keeps its connection from one request to the next instead of opening a new one each time
    (the pools are made with httpx2's keep-alive expiry at ``longest``, so only this table
    decides). The pace is read when a pool is found idle past the keep-alive it had, not on
    every request: a pool whose pace asks for longer is kept for that from its last use, and
    keeps it from then on; a slot's pause counts as its pace when longer, so a host that
    answered with a ``Retry-After`` keeps its connection for the request after it. Each request
    looks at a few of the oldest, so closing keeps pace with opening; a pool kept longer than
    the ones behind it holds their closing back by at most ``longest``.
    """

    __slots__ = ("_lock", "_make", "_origins", "expiry", "longest")

    #: Pools looked at per request for being idle past their keep-alive.
    SWEEP = 8
    #: A slot's pace times this is how long its origin's connection is kept:
    #: the next turn may come late by the throttle's jitter or the loop's lag.
    PACE_MARGIN = 1.5
    #: An origin whose last request was taken this recently (seconds) still has
    #: its idle connection open, as far as a request's wire turn goes: servers
    #: close an idle connection later than this (gunicorn's 2 s is the
    #: shortest common default; nginx's is 75 s).
    RECENT = 1.0

    def __init__(
        self,
        make: Callable[[], Any],
        expiry: float,
        longest: float | None = None,
        *,
        threads: bool = True,
    ) -> None:
        self._make = make
        self._origins: OrderedDict[Origin, PooledOrigin] = OrderedDict()
        self._lock = threading.Lock() if threads else None
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

    def take(
        self, url: httpx2.URL, now: float, lease: Lease | None = None
    ) -> tuple[PooledOrigin, Sequence[Any]]:
        """The pool for ``url``'s origin and the pools to close (:meth:`lend`)."""
        entry, closing, _ = self.lend(url, now, lease)
        return entry, closing

    def lend(
        self, url: httpx2.URL, now: float, lease: Lease | None = None
    ) -> tuple[PooledOrigin, Sequence[Any], bool]:
        """The pool for ``url``'s origin, made on first use and counted as
        sending until :meth:`done`; the pools to close: the oldest few idle
        past their keep-alive, taken out of the table (one hold of the lock
        for both); and whether the origin's last request was taken less than
        :attr:`RECENT` seconds ago. ``lease``: the request's, whose slot's
        pace may keep the pool longer (unthrottled requests have none).
        """
        lock = self._lock
        if lock is None:
            return self.lend_unlocked(url, now, lease)
        lock.acquire()  # not `with`: on every request, it costs twice as much
        try:
            return self.lend_unlocked(url, now, lease)
        finally:
            lock.release()

    def lend_unlocked(
        self, url: httpx2.URL, now: float, lease: Lease | None = None
    ) -> tuple[PooledOrigin, Sequence[Any], bool]:
        """:meth:`lend` without the lock: the async client's, whose pools are
        used from its event loop's thread alone, calls it directly."""
        origin = origin_of(url)
        origins = self._origins
        entry = origins.get(origin)
        if entry is None:
            entry = origins[origin] = PooledOrigin(self._make(), now, self.expiry)
            recent = False
        else:
            origins.move_to_end(origin)
            recent = now - entry.used_at < self.RECENT
            entry.used_at = now
            entry.expires_at = now + entry.keep
        if entry.slot is None and lease is not None:
            entry.slot = lease.slot
        entry.sending += 1
        if next(iter(origins.values())).expires_at > now:
            return entry, (), recent  # the oldest is still kept: the usual, found at once
        return entry, self._expired(now), recent

    def done(self, entry: PooledOrigin) -> None:
        """A request of ``entry``'s pool is sent: answered, failed or cancelled."""
        lock = self._lock
        if lock is None:
            entry.sending -= 1
            return
        lock.acquire()
        entry.sending -= 1
        lock.release()

    def expired(self, now: float) -> list[Any]:
        """The pools idle past their keep-alive among the oldest few, taken out of the table."""
        with self._lock or nullcontext():
            return self._expired(now)

    def _expired(self, now: float) -> list[Any]:
        origins = self._origins
        closing: list[Any] = []
        for _ in range(min(self.SWEEP, len(origins))):
            origin, entry = next(iter(origins.items()))
            if entry.expires_at > now:
                break  # kept, and those after it were used more recently
            del origins[origin]
            if entry.sending or not _idle(entry.pool):
                entry.expires_at = now + entry.keep  # busy (a long download): look again later
                origins[origin] = entry
                continue
            slot = entry.slot
            keep = self.expiry if slot is None else self.keep_for(_pace(slot))
            if entry.used_at + keep > now:  # its pace asks for longer: kept for that
                entry.keep = keep
                entry.expires_at = entry.used_at + keep
                origins[origin] = entry
            else:
                closing.append(entry.pool)
        if closing and len(closing) * 2 > len(origins):
            # A dict never shrinks by itself: after a mass closing, rebuild it.
            self._origins = OrderedDict(origins)
        return closing

    def clear(self) -> list[Any]:
        with self._lock or nullcontext():
            pools = [entry.pool for entry in self._origins.values()]
            self._origins.clear()
        return pools


def _pace(slot: Slot) -> float:
    """How long after its last request a slot's next may come: its delay, or a
    pause when longer (a ``Retry-After``, a rate limit's reset: the adaptive
    policy's usual wait at a host that refused), counted from the slot's last
    activity, its last response (the throttle's clock, which the pools do not
    share: a length, not a time)."""
    pace = slot.delay
    pause = slot.pause_until - slot.last_activity
    return pause if pause > pace else pace


def _idle(transport: Any) -> bool:
    """No connection of an httpx2 transport's pool is busy or being opened."""
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
        return False  # not httpx2's own pool: nothing known
    return not any(c.is_idle() for c in connections)


class Openings:
    """At most :attr:`LIMIT` requests of a client opening a connection at once.

    A broad crawl finds hosts faster than the client can open connections to
    them: a new connection costs the event loop about twice a request's CPU,
    and past what the loop can serve, each waits its turn in the loop until
    httpx2's connect timeout (5 s) fails it, spent work and all, and the
    failures come back at the next turn. Queued here instead, a request opens
    its connection once one of the others is done: late, not lost (the host
    still sees the slot's gap, from the wire turn). httpx2's own single pool
    allows 100 connections in all; this bounds only the ones being opened,
    with the request they carry. A pool timeout you set bounds the wait here
    too (``httpx2.PoolTimeout``); httpx2's default does not.
    """

    __slots__ = ("_async", "_sync")

    LIMIT = 100

    def __init__(self) -> None:
        self._sync = threading.BoundedSemaphore(self.LIMIT)
        self._async: anyio.Semaphore | None = None  # made in the event loop, on first use

    async def enter(self, request: httpx2.Request) -> None:
        semaphore = self._async
        if semaphore is None:
            semaphore = self._async = anyio.Semaphore(self.LIMIT)
        bound = pool_bound(request.extensions, client=True)  # the throttled client's own pools
        if bound is None:
            await semaphore.acquire()
            return
        try:
            with anyio.fail_after(bound):
                await semaphore.acquire()
        except TimeoutError as error:
            raise httpx2.PoolTimeout(_OPENING_TIMEOUT.format(bound)) from error

    def leave(self) -> None:
        if self._async is not None:
            self._async.release()

    def enter_blocking(self, request: httpx2.Request) -> None:
        bound = pool_bound(request.extensions, client=True)  # the throttled client's own pools
        if not self._sync.acquire(timeout=bound):
            raise httpx2.PoolTimeout(_OPENING_TIMEOUT.format(bound))

    def leave_blocking(self) -> None:
        self._sync.release()


_OPENING_TIMEOUT = "no turn to open a connection within the pool timeout ({:g} s)"


# -- HTTP/2: one request of an origin at a time between its hand-over and its headers --


class Serial:
    """An origin's requests one at a time from their hand-over to an HTTP/2
    pool until their headers go out (taken by :meth:`Serials.enter`, given
    back by the request's wiring once it is on the wire), first come first.

    httpcore2 numbers an HTTP/2 request's stream before its
    ``send_request_headers`` trace event, where the wire turn waits; numbers
    must go out in order, and another request numbered meanwhile gets the
    same number (one of the two then fails with a protocol error). So the
    next request of the origin is handed over only once the one before has
    its headers out. Over HTTP/1.1 (a server that does not take HTTP/2) that
    costs little: httpcore2 with HTTP/2 on queues a request on a connection
    still being opened anyway, until it knows the protocol.

    The wait here is bounded by what bounds the request before it on the
    way to its headers: its connect and TLS timeouts, and its wire turn,
    which the request behind would wait for anyway (it comes after it).

    The async client's requests wait on an ``anyio.Lock``, which serves its
    waiters in order. The sync client's threads each wait on a lock of their
    own, queued as they come (under :class:`Serials`' lock) and handed the
    turn in that order: a ``threading.Lock`` of the origin's would let a
    thread that just gave the turn back take it again before the threads
    waiting for it (per-slot FIFO).
    """

    __slots__ = ("busy", "origin", "queue", "table", "users", "waiting")

    def __init__(self, table: Serials, origin: Origin) -> None:
        self.table = table
        self.origin = origin
        self.waiting: anyio.Lock | None = None  # the async client's, made in its event loop
        self.users = 0
        #: The sync client's: a thread is between its hand-over and its headers,
        #: and the threads waiting for the turn, each on a lock of its own.
        self.busy = False
        self.queue: deque[threading.Lock] = deque()

    def leave(self, http2: bool = True) -> None:
        """The request's headers are out (``http2``: on an HTTP/2 connection, or
        not known), or it failed first: the next request of the origin may go."""
        if not http2:
            self.table.learned(self.origin)
        if self.waiting is not None:
            self.waiting.release()
            return
        with self.table.lock:
            if self.queue:
                self.queue.popleft().release()  # handed over: still busy
            else:
                self.busy = False


class Passing:
    """What a request of an origin learned to need no hand-over in turn carries
    to its headers (:meth:`Serials.passing`), in the place of a :class:`Serial`:
    one of the origin's, made when it was learned.

    Gone out on HTTP/2 after all (the user's transport changed, or ALPN chose
    ``h2`` on a new connection), the origin is forgotten: its next requests
    are handed over one at a time again. Those handed over meanwhile, before
    any of them had its headers out, were numbered unguarded: nothing can
    tell HTTP/2 sooner than a request's headers (the first trace event that
    names the protocol), and waiting for them at every request is the cost
    learning saves an HTTP/1.1 origin.
    """

    __slots__ = ("origin", "table")

    def __init__(self, table: Serials, origin: Origin) -> None:
        self.table = table
        self.origin = origin

    def leave(self, http2: bool = True) -> None:
        """The request's headers are out, on HTTP/2 (``http2``) or HTTP/1.1."""
        if http2:
            self.table.plain.pop(self.origin, None)


class Serials:
    """The :class:`Serial` of each origin an HTTP/2 pool is sending to, kept while in use.

    ``learn``: the pool's protocol is not known (a transport of the user's that
    wraps httpx2's own, where nothing says whether HTTP/2 is on): an origin's
    requests are handed over one at a time until one of them has gone out on
    an HTTP/1.1 connection (its ``http11.send_request_headers`` trace event), or
    was answered with no trace event at all (not httpcore2's pool: no stream
    numbers, and no wire turn either); from then on the origin's requests go
    straight to the pool, until one of them goes out on HTTP/2 (:class:`Passing`).
    Kept for :attr:`LEARNED_MOST` origins, then forgotten together: an origin
    forgotten is learned again by its next request.
    """

    __slots__ = ("_table", "learn", "lock", "plain")

    #: Origins learned to need no hand-over in turn, at most.
    LEARNED_MOST = 4096

    def __init__(self, learn: bool = False) -> None:
        self._table: dict[Origin, Serial] = {}
        #: The table, and the sync client's queues: threads share its transport.
        self.lock = threading.Lock()
        self.learn = learn
        #: Learned: HTTP/1.1, or no trace events. Read and written under the GIL
        #: alone (one operation each): a thread that misses a change hands one
        #: request over as the change found it.
        self.plain: dict[Origin, Passing] = {}

    def passing(self, url: httpx2.URL) -> Passing | None:
        """The :class:`Passing` of ``url``'s origin when it was learned to need no
        hand-over in turn, else None."""
        plain = self.plain
        return plain.get(origin_of(url)) if plain else None

    def learned(self, origin: Origin) -> None:
        """``origin``'s request went out on an HTTP/1.1 connection, or was answered
        untraced: its next requests go straight to the pool (when learning)."""
        if not self.learn:
            return
        plain = self.plain
        if origin in plain:
            return
        if len(plain) >= self.LEARNED_MOST:
            plain.clear()
        plain[origin] = Passing(self, origin)

    def _take(self, url: httpx2.URL) -> Serial:
        """The origin's serial, counted as used (under :attr:`lock`)."""
        origin = origin_of(url)
        serial = self._table.get(origin)
        if serial is None:
            serial = self._table[origin] = Serial(self, origin)
        serial.users += 1
        return serial

    async def enter(self, url: httpx2.URL) -> Serial:
        """Wait for the origin's turn to hand a request over."""
        with self.lock:
            serial = self._take(url)
        lock = serial.waiting
        if lock is None:
            lock = serial.waiting = anyio.Lock()
        try:
            await lock.acquire()
        except BaseException:
            self.done(serial)
            raise
        return serial

    def enter_blocking(self, url: httpx2.URL) -> Serial:
        """:meth:`enter` for a thread: queued now, served in the order of coming."""
        with self.lock:
            serial = self._take(url)
            if not serial.busy:
                serial.busy = True
                return serial
            waiter = threading.Lock()
            waiter.acquire()
            serial.queue.append(waiter)
        try:
            waiter.acquire()  # released by the thread handing the turn over
        except BaseException:  # an interrupt: out of the queue, or the turn passed on
            with self.lock:
                queued = waiter in serial.queue
                if queued:
                    serial.queue.remove(waiter)
            if not queued:
                serial.leave()
            self.done(serial)
            raise
        return serial

    def done(self, serial: Serial) -> None:
        """The request is sent, or failed: the origin's entry goes with its last user."""
        with self.lock:
            serial.users -= 1
            if serial.users == 0:
                del self._table[serial.origin]


def http2(transport: Any) -> bool | None:
    """Whether ``transport`` is httpx2's own with HTTP/2 on (True) or off (False),
    as its httpcore2 pool's ``_http2`` says; None when nothing says (a transport
    of the user's that wraps httpx2's own, one of another kind, an httpcore2
    without the name): :class:`Serials` then learns each origin's protocol."""
    flag = getattr(getattr(transport, "_pool", None), "_http2", None)
    return flag if type(flag) is bool else None


#: httpx2's limits for a client given none (equal ones count as none).
_DEFAULT_LIMITS = httpx2.Limits(max_connections=100, max_keepalive_connections=20)

#: The longest an idle origin's connection is kept for its slot's pace, when
#: the client was given httpx2's default limits: a slower host opens a new
#: connection per request, which at that pace costs little.
LONGEST_KEEP_ALIVE = 60.0


def pools_for(
    throttle: Throttle,
    make: Callable[..., Any],
    pool_per_host: bool | None,
    kwargs: dict[str, Any],
    threads: bool = True,
) -> Pools | None:
    """The per-origin pools of a client built with ``_init_transport(**kwargs)``, or None.

    ``threads``: the client may send from several threads (the sync client):
    the table is locked (:class:`Pools`).

    Every pool shares one SSL context, made once here as httpx2 makes its
    own for a client: making one per pool cost 30-60 ms and most of a
    megabyte per host. Pools close after httpx2's keep-alive expiry (or, with
    none, the throttle's store's idle timeout). With httpx2's default limits,
    an origin whose slot's pace is longer than that expiry keeps its pool for
    the pace, up to :data:`LONGEST_KEEP_ALIVE` and the store's idle timeout
    (a pool never outlives its slot); limits you set keep their expiry.
    """
    if pool_per_host is False or kwargs.get("transport") is not None:
        return None
    # httpx2 imports httpcore2 when it makes its first transport, which plain
    # httpx2 does as the client is built. Pools are made at each origin's first
    # request, so that import (50 ms quiet, about a second on a busy machine,
    # trio's with it where trio is installed) would block the event loop, and
    # every other request on it, in the middle of a crawl: it is done here.
    import httpcore2  # noqa: F401

    context = httpx2.create_ssl_context(
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
        settings["limits"] = httpx2.Limits(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=longest,
        )
    return Pools(lambda: make(**settings), expiry, longest, threads=threads)


def check_pool_per_host(pool_per_host: object, transport: object) -> bool | None:
    if pool_per_host is not None and not isinstance(pool_per_host, bool):
        raise TypeError(f"pool_per_host must be a bool, got {pool_per_host!r}")
    if pool_per_host and transport is not None:
        raise ValueError(
            "pool_per_host=True makes httpx2's own transport per host; "
            f"it cannot be combined with transport={transport!r}"
        )
    return pool_per_host
