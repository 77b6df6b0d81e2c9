"""A lease: one request's hold on its slot, from send until its response is finished."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Protocol

from ._slot import LiveSlot, Slot

__all__ = ["Lease", "lease_at"]


class Reporter(Protocol):
    """Where a lease reports its response: the throttle's rules."""

    def answered(
        self,
        slot: LiveSlot,
        lease: Lease,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None,
        from_cache: bool | None,
        done: bool,
    ) -> None:
        """Apply ``lease``'s response to ``slot`` (its ``adjust`` and ``sent_at``
        are the lease's). ``done``: the response is finished as it is observed,
        and ``slot``'s gate lets go of ``lease`` in the same step (the lease has
        marked itself released already); whatever observing raises, it lets go."""
        ...

    def fail(self, slot: LiveSlot, error: BaseException, *, sent_at: float) -> None: ...


class Lease:
    """One request's hold on its slot, from send until its response is finished.

    The adapters take and release leases for you. Use one directly to throttle
    a client autothrottle has no adapter for::

        with await throttle.acquire("example.com") as lease:
            response = await send()
            lease.observe(latency=response.elapsed, status=response.status)

    ``release`` is idempotent. A lease never released stops counting as in
    flight after the throttle's ``hold_timeout``.

    Attributes:
        sent_at: When the lease was granted, on the throttle's clock.
        expires_at: When it stops counting as in flight if never released.
        adjust: False when the response must not change the slot's delay.
        wire_gap: The spacing the grant kept after the slot's previous grant.
    """

    __slots__ = (
        "__weakref__",
        "_live",
        "_released",
        "_reporter",
        "adjust",
        "expires_at",
        "on_release",
        "on_wire",
        "sent_at",
        "wire_asked",
        "wire_gap",
    )

    def __init__(
        self, live: LiveSlot, reporter: Reporter, sent_at: float, expires_at: float, adjust: bool
    ) -> None:
        self._live = live
        self._reporter = reporter
        self.sent_at = sent_at
        self.expires_at = expires_at
        self.adjust = adjust
        self.wire_gap = 0.0
        self.wire_asked = -math.inf
        self.on_release: Callable[[], None] | None = None
        self.on_wire: Callable[[], float] | None = None
        self._released = False

    @property
    def slot(self) -> Slot:
        """The slot the request was sent to."""
        return self._live.view

    @property
    def released(self) -> bool:
        """True once the lease no longer counts as in flight."""
        return self._released

    def wire_wait(self) -> float:
        """Take this request's turn on the wire: 0.0 when it may go now, else
        the seconds to wait before asking again.

        Call it when the connection is ready, just before the request is
        written, and until it returns 0.0: the gap the slot granted is then
        also the gap the host sees, however long the request waited for a
        connection (``docs/scheduling.md``, rule 10). The adapters do this.
        A fleet's turn looks at its lateness first (``on_wire``: the fleet's
        rule 1, :class:`~autothrottle._fleet_wire.WireCheck`).
        """
        check = self.on_wire
        if check is not None:
            wait = check()
            if wait > 0.0:
                return wait
        return self._live.gate.wire_wait(self)

    def started_late(self, seconds: float) -> None:
        """Say, before observing, that the latency given for this request was
        timed from ``seconds`` after its wire turn (Scrapy's ``download_latency``
        starts at its download handler): a strict pace's arrival guard counts
        them too, so that a request held up on its way to the wire does not let
        the next one arrive early (``docs/scheduling.md``, rule 10)."""
        self._live.gate.started_late(self.sent_at, seconds)

    def observe(
        self,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None = None,
        from_cache: bool | None = None,
    ) -> None:
        """Apply this request's response to its slot (unless ``adjust`` is off).

        Pass ``from_cache=True`` when a client-side cache answered (hishel's
        ``response.extensions["from_cache"]``, aiohttp-client-cache's
        ``response.from_cache``): the response is then a cache hit, as if a
        header had said so (``docs/signals.md``, "Caches").
        """
        self._reporter.answered(self._live, self, latency, status, headers, from_cache, False)

    def finish(
        self,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None = None,
        from_cache: bool | None = None,
    ) -> None:
        """:meth:`observe`, then :meth:`release`, in one step: for a response
        that is finished as it arrives (its body came with its headers, or it
        has none). The lease is released even if observing raises.
        """
        if self._released or self.on_release is not None:  # expired, or a fleet's
            try:
                self.observe(latency, status, headers, from_cache)
            finally:
                self.release()
            return
        self._released = True  # the gate lets go of it as the response is applied
        try:
            self._reporter.answered(self._live, self, latency, status, headers, from_cache, True)
        except BaseException:
            # Raised before the gate let go, perhaps: nobody else will now (letting
            # go of a hold twice is harmless).
            self._live.gate.release(self)
            raise

    def fail(self, error: BaseException) -> None:
        """Record that the request failed without a response (refused, reset, timed out).

        A failure gives no latency sample. Cancellation is not a failure: just
        release the lease.
        """
        self._reporter.fail(self._live, error, sent_at=self.sent_at)

    def release(self) -> None:
        """Stop counting the request as in flight; safe to call more than once."""
        if not self._released:
            self._released = True
            self._live.gate.release(self)
            if self.on_release is not None:  # a shared store's lease on the slot
                self.on_release()

    def expire(self) -> None:
        """Called by the gate when the hold timed out; the gate has let go already.

        A fleet's lease (``on_release`` set) stays unreleased: its request may
        still wait for the fleet's turn (a pause, the cap), and it ends as any
        other, its release handing back what it holds of the fleet (its turn's
        lease in the store, its run's rest: the fleet's rule 7), which nothing
        else would until ``hold_timeout`` after its send; the gate letting go
        of it again then is harmless. Marked released, that release did
        nothing, and the fleet's other processes waited for the store's expiry."""
        if self.on_release is None:
            self._released = True

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


_new_object = object.__new__
_NEVER = -math.inf


def lease_at(
    live: LiveSlot, reporter: Reporter, expiry: float, adjust: bool, sent_at: float
) -> Lease:
    """``Lease(live, reporter, sent_at, sent_at + expiry, adjust)``, the same
    object, for the gate's grant of every request: calling a class runs its
    ``__init__`` through the type, with the arguments packed first; a slot's
    maker is this function with its first four arguments bound
    (``functools.partial``), so a grant costs one Python call, not two. The
    fields are :meth:`Lease.__init__`'s (a test compares the two)."""
    lease: Lease = _new_object(Lease)
    lease._live = live  # noqa: SLF001 (this module's own class)
    lease._reporter = reporter  # noqa: SLF001 (this module's own class)
    lease.sent_at = sent_at
    lease.expires_at = sent_at + expiry
    lease.adjust = adjust
    lease.wire_gap = 0.0
    lease.wire_asked = _NEVER
    lease.on_release = None
    lease.on_wire = None
    lease._released = False  # noqa: SLF001 (this module's own class)
    return lease
