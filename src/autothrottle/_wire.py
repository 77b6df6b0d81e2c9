"""The gate's first layer: the wire keeps each grant's spacing (rule 10).

A grant may wait in the client's pool or on connection setup and then leave
together with others; the wire keeps each grant's spacing
(``docs/scheduling.md``, rule 10). :class:`WireTurn` is the part of a slot's
gate that holds this: what went on the wire last, with which gap; how long a
grant takes to reach the wire (the lead, by which a spaced grant is made
early); and, while the slot's pace is strict, the arrival guard
(:mod:`autothrottle._arrivals`): when the last request on the wire reached
its host at the latest, and the margin a strict pace keeps; or, while the
host's own count shows a request to spare, when the last send was due.

:class:`~autothrottle._gate.Gate` is written over it. The fields here are
written only by this module; the gate reads them through the public names
below (``lead``, :meth:`WireTurn.counts_from`, ``arrivals``) and
:meth:`WireTurn.late`, by which the gate tells how late a head came after it
was told it may go: the timing noise of this process, kept on every slot
(``lateness``, and ``lag``, what of it a latency carries: the adaptive
policy discounts it, ``docs/signals.md``, "The client's own lag"). Like the
gate, it reads time only through the injected clock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Protocol

from ._arrivals import ArrivalGuard
from ._headers import RateLimit
from ._policy import SlotConfig
from ._state import SlotState
from ._tokens import TokenBook, TokenBudget

__all__ = ["Clock", "Hold", "WireTurn", "shows_spare"]

Clock = Callable[[], float]


class Hold(Protocol):
    """What the gate keeps of one request in flight (a lease, for the throttle)."""

    @property
    def expires_at(self) -> float:
        """When the hold stops counting even if never released."""
        ...

    def expire(self) -> None:
        """Mark the hold released by expiry (the gate has already let go of it)."""
        ...

    sent_at: float
    """When it was granted."""

    @property
    def released(self) -> bool:
        """Whether it was let go."""
        ...

    wire_gap: float
    """The spacing its grant kept after the grant before it; the wire keeps it too."""

    wire_asked: float
    """When it last asked for its wire turn and was told to wait."""


_LEAD_WEIGHT = 0.1
"""Weight of one grant's way to the wire in the averaged lead (about the last 10)."""

_MAX_LEAD = 0.05
"""Seconds one grant's way to the wire counts for at most (a new connection's
handshake is not the usual way)."""

_LATE_WEIGHT = 0.1
"""Least weight of one grant's lateness in the averaged timing noise (about the last
10 count; the first ones weigh 1/n, so it starts as their plain mean)."""

_NEVER = -math.inf
"""A hold's ``wire_asked`` before its first ask (a constant: no lookup and negation per ask)."""

TIMER_GRAIN = 0.001
"""Seconds of a timer's lateness that are its grain, not the client's lag: asyncio's
selector waits whole milliseconds (rounded up), so a timer on an idle loop
fires up to 1 ms late, where an answer read on the same loop is not."""


def shows_spare(budget: RateLimit | None) -> bool:
    """Whether an answer's budget shows the host a request to spare after it:
    at least one left of a quota of requests, and fewer than the whole quota.

    A count that stays at the whole quota whatever is sent (some hosts state
    what their window allows, not what is left of it, and still refuse a
    request that arrives early) shows nothing of this moment.
    """
    if budget is None or budget.unit != "requests" or budget.limit is None:
        return False
    return 1 <= budget.remaining < budget.limit


class WireTurn:
    """What one slot's gate keeps of the wire: the last request on it, the lead,
    the arrival guard; and the slot's record, settings, clock and lock, which
    every layer of the gate reads."""

    __slots__ = (
        "_grant_at",
        "_grant_due",
        "_late_start",
        "_lates",
        "_spare",
        "_wire_due",
        "_wire_gap",
        "_wire_granted",
        "_wire_last",
        "arrivals",
        "clock",
        "config",
        "lag",
        "lateness",
        "lead",
        "lock",
        "state",
    )

    token_book: TokenBook
    """The host's token windows (the gate's): a grant the wire holds is in no answer yet."""

    def __init__(self, state: SlotState, config: SlotConfig, clock: Clock) -> None:
        self.state = state
        self.config = config
        self.clock = clock
        # Threads (the sync client, several event loops) share slots: every
        # change to the gate and to the slot's state happens under this lock.
        self.lock = threading.RLock()
        # How long a grant takes to reach its wire turn (the client's pool and
        # locks), averaged: a spaced grant is made that much early (rule 10).
        self.lead = 0.0
        self._wire_last: float | None = None
        # The grant time and gap of the request that last went on the wire.
        self._wire_granted = -math.inf
        self._wire_gap = 0.0
        # When the request that last went on the wire reached the host, at the
        # latest; kept only while the slot's pace is strict (rule 10).
        self.arrivals: ArrivalGuard | None = None
        # While the host's count shows a request to spare after the last one
        # on the wire, gaps count from when sends were due (rule 10): the
        # last grant's time and due time, the last wire send's due time, kept
        # while the pace is strict (inf: not known, count from when it went).
        self._spare = False
        # Seconds the last request on the wire started its client's latency
        # clock after its wire turn (:meth:`started_late`).
        self._late_start = 0.0
        self._grant_at = -math.inf
        self._grant_due = math.inf
        self._wire_due = math.inf
        # How late the gate's heads came after they were told they may go,
        # averaged (the timing noise of this process: the arrival margin of a
        # strict pace), and what of it is the client's lag rather than a
        # timer's grain (a latency carries it too: the adaptive policy's
        # estimate discounts it).
        self.lateness = 0.0
        self.lag = 0.0
        self._lates = 0

    def counts_from(self, last: float | None, due: float, gap: float) -> float | None:
        """Where the next gap counts from after a send at ``last`` (due at ``due``,
        ``gap`` after the send before it): ``last``; with a strict pace the
        latest the last request on the wire may have reached the host, and the
        arrival margin on top; but while the host's count shows a request to
        spare, when that send was due, at most half a gap before it went
        (rule 10).

        A send let go late (a busy event loop) then costs the pace nothing: the
        next one keeps the schedule, and the host's spare request absorbs the
        shorter gap between the two. Half a gap back at most: a stall never
        turns into a burst, and the other half of the spare is left for what
        the client cannot see (a request held up on its way, or stamped late by
        the host; a client whose wire turn is not the wire, as Scrapy's). The
        count the next answer shows says again.
        """
        arrivals = self.arrivals
        if arrivals is None or last is None:
            return last
        if self._spare:
            if due >= last:
                return last
            back = last - 0.5 * gap
            return due if due > back else back
        # The margin's share is of the gap the sends keep: a pace the host stated
        # is kept apart from the policy's own delay (the adaptive one's is a
        # fraction of it), and 2 % of that delay would leave no room for a step.
        delay = self.state.pace.delay
        return arrivals.since(last, gap if gap > delay else delay, self.lateness)

    def late(self, seconds: float) -> None:
        """A head told to wait was let go ``seconds`` after its time (a grant
        after a timed wait, on any slot): the averaged ``lateness`` and ``lag``.

        Only a timed wait counts: a head woken by a release resumes within the
        loop's turn, and says less of how late a busy loop reads what came.
        """
        self._lates += 1
        weight = 1.0 / self._lates  # the plain mean of the first ones
        if weight < _LATE_WEIGHT:
            weight = _LATE_WEIGHT
        lateness = self.lateness
        lateness += weight * ((seconds if seconds > 0.0 else 0.0) - lateness)
        self.lateness = lateness
        self.lag = lateness - TIMER_GRAIN if lateness > TIMER_GRAIN else 0.0

    def granted(self, now: float, due: float) -> None:
        """The gate granted a hold at ``now``, due at ``due`` (the gap's end)."""
        self._grant_at = now
        self._grant_due = due if -math.inf < due < now else now

    def wire_wait(self, hold: Hold) -> float:
        """Pass a granted request onto the wire now, or say how long to wait first.

        A grant may wait in the client's pool or on connection setup and then leave together
        with others; the wire keeps each grant's spacing (``docs/scheduling.md``, rule 10).
        Returns 0.0 when the request may go now, and records that it went: no sooner than the
        last request that went plus this hold's gap, and not during a pause. Otherwise returns
        the seconds to wait before asking again. The check and the record are one step under
        the lock, so two requests never pass closer than the gap, however late either wakes
        up. A cost held here is in no answer until it goes (:meth:`TokenBudget.hold`).
        """
        lock = self.lock
        lock.acquire()  # not `with`: on every request, it costs twice as much
        try:
            # The clock taken into a local first: Python 3.11 looks a call on an
            # attribute that holds no method (a field, not a def) up the slow way.
            clock = self.clock
            now = clock()
            sent_at = hold.sent_at
            if hold.wire_asked == _NEVER:  # its first ask: the connection is ready
                took = now - sent_at  # min(took, _MAX_LEAD), without its call
                lead = self.lead
                self.lead = lead + _LEAD_WEIGHT * ((took if took < _MAX_LEAD else _MAX_LEAD) - lead)
            last = self._wire_last
            if self.arrivals is not None:  # else counts_from says `last`, without its call
                last = self.counts_from(last, self._wire_due, self._wire_gap)
            pause_until = self.state.limits.pause_until
            if last is None:
                at = pause_until
            else:
                # Two requests may reach the wire in the other order than they
                # were granted (the earlier one waited on a pool being built):
                # between them goes the gap of the later grant of the two.
                at = last + (hold.wire_gap if sent_at >= self._wire_granted else self._wire_gap)
                if at < pause_until:
                    at = pause_until
            if now < at and now > hold.wire_asked:
                if hold.wire_asked == _NEVER and self.token_book.spends:
                    TokenBudget.hold(self.token_book, hold)  # its cost is in no answer yet
                hold.wire_asked = now
                return at - now
            # Go now; also when the clock has not moved since this hold last
            # asked (an injected clock that real sleeps do not advance).
            if hold.wire_asked != _NEVER and self.token_book.held:
                TokenBudget.went(self.token_book, hold, now)
            self._wire_last = now
            if self.arrivals is not None:
                # When it was due: its turn here, or its grant's when later (rule 10).
                due = self._grant_due if sent_at == self._grant_at else sent_at
                if last is not None and at > due:
                    due = at
                self._wire_due = due if due < now else now
                self._spare = False  # the count was read before this one took its share
                self._late_start = 0.0
            self._wire_granted = sent_at
            self._wire_gap = hold.wire_gap
            return 0.0
        finally:
            lock.release()

    def answered(
        self, sent_at: float | None, latency: float, now: float, budget: RateLimit | None = None
    ) -> None:
        """An answer came, ``latency`` seconds after its request (granted at
        ``sent_at``) went on the wire, with the host's ``budget`` (None: no
        count to go by): note when that request reached the host, at the
        latest, while the slot's pace is strict, and whether the host's count
        shows a request to spare after it (rule 10). A refusal at the stated
        pace (a widened margin) says the count cannot be taken at its word."""
        arrivals = self.arrivals
        if arrivals is None:
            if not self._strict(now):
                return
            arrivals = self.arrivals = ArrivalGuard()
        last = sent_at is not None and sent_at == self._wire_granted
        if last:
            self._spare = arrivals.refused_margin == 0.0 and shows_spare(budget)
            latency += self._late_start
        arrivals.answered(latency, self._wire_last if last else None)

    def started_late(self, sent_at: float, seconds: float) -> None:
        """The request granted at ``sent_at`` started its client's latency clock
        ``seconds`` after its wire turn: while it is the last on the wire, the
        arrival guard counts them in its answer's latency (rule 10), the policy
        does not. A client whose wire turn is not the wire (Scrapy's: its
        ``download_latency`` starts at the download handler, a loop turn or more
        after the turn, milliseconds on a busy loop) would otherwise let the
        next request, sent on time, arrive early by what the turn's way to the
        handler took."""
        with self.lock:
            if self.arrivals is not None and sent_at == self._wire_granted:
                self._late_start = seconds if seconds > 0.0 else 0.0

    def widen_margin(self, gap: float) -> bool:
        """A refusal at the stated pace ``gap``: the arrival margin grows a step,
        and the gap after the refused request's keeps the makeup (rule 10).
        False when there is no guard or its margin is at its most: then the
        refusal is not the host's jitter (``docs/recovery.md``)."""
        arrivals = self.arrivals
        return arrivals is not None and arrivals.widen(gap, self.clock())

    def _strict(self, now: float) -> bool:
        """Whether the slot's gap is a pace it was told the host holds arrivals
        to: the policy's own fixed pace, a ``min_delay``, or a pace the host
        stated in its headers."""
        config = self.config
        if config.policy.strict_spacing or config.min_delay > 0.0:
            return True
        limits = self.state.limits
        return now < limits.sustained_until or now < limits.budget_until
