"""The gate of one slot: who may send now, with no I/O.

Everything here is synchronous and reads time only through the injected
clock, so the scheduling rules (``docs/scheduling.md``) can be tested by
setting the clock by hand. Waiting is the driver's business
(:mod:`autothrottle._driver`): it parks a :class:`Ticket` in the queue, asks
:meth:`Gate.try_acquire` how long to wait, and sleeps until then or until the
gate wakes the ticket.

The gate reads the slot's learned state (the pace, the limits, the cap) from
its :class:`~autothrottle._state.SlotState` and writes none of it but the
counters of sends (through :class:`~autothrottle._counters.Counters`). It
keeps only what belongs to this process: the queue, the holds in flight, the
last send, the delay its gap began with, the jitter factor, the burst tokens.
What it keeps of the wire (rule 10: the last request on it, the lead, for a
strict pace the arrival guard) is its first layer,
:class:`~autothrottle._wire.WireTurn`, which :class:`Gate` is written over.

This module's interface to the rest of the engine is :class:`Gate`'s public
methods; nothing outside the engine calls it.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from ._pace import RampUp
from ._policy import SlotConfig
from ._request import Cost
from ._state import SlotState
from ._tokens import TokenBook, TokenBudget
from ._wire import Clock, Hold, WireTurn

__all__ = ["Gate", "Hold", "Ticket"]


H = TypeVar("H", bound=Hold)


def _no_wake() -> None:
    return None


def _alive() -> bool:
    return True


class Ticket:
    """A request waiting in a gate's queue.

    ``wake`` is set by the driver to whatever resumes the waiting task, from
    any thread; ``alive`` says whether that task can still run (its event loop
    is not closed); ``hold`` is set, synchronously, when the ticket is granted;
    ``cost`` is the request's weight in tokens, if it has one.
    """

    __slots__ = ("alive", "cost", "hold", "wake")

    def __init__(self, cost: Cost | None = None) -> None:
        self.wake: Callable[[], None] = _no_wake
        self.alive: Callable[[], bool] = _alive
        self.hold: Hold | None = None
        self.cost = cost


_NO_QUEUE: deque[Ticket] = deque()
"""The queue of a gate nobody has waited at yet: shared, empty, and never
appended to (:meth:`Gate.enqueue` makes the gate its own first). An empty deque
holds a block of 64 places, 760 bytes a slot, and most slots of a broad crawl
never queue a request."""


class Gate(WireTurn):
    """FIFO queue, concurrency cap, spacing, burst, pause and budget of one slot."""

    __slots__ = (
        "_at",
        "_begun",
        "_due",
        "_factor",
        "_gap",
        "_holds",
        "_plain_grant",
        "_queue",
        "_rng",
        "_single",
        "_tokens",
        "_tokens_at",
        "_window_sends",
        "last_send",
        "soonest",
        "token_book",
    )

    def __init__(
        self,
        state: SlotState,
        config: SlotConfig,
        *,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        super().__init__(state, config, clock)
        self._rng = rng
        self._queue: deque[Ticket] = _NO_QUEUE
        self._holds: set[Hold] = set()
        # No hold expires before this (a lower bound): most checks for expired
        # holds, one per response, then cost no walk over the holds, and the
        # usual response (``LiveSlot.respond``) no call.
        self.soonest = math.inf
        # The gap the next send keeps after the last one, as _admit found it.
        self._gap = 0.0
        # When the next send may go, as _admit last found it granting nothing
        # (send_at's answer, the queue's wait).
        self._at = -math.inf
        self.last_send: float | None = None
        self._factor = 1.0
        # The delay in force at the last grant: a gap once begun is never
        # shortened by a delay that fell since (rule 3).
        self._begun = 0.0
        # When the head was told it may go: how late it comes is the timing
        # noise of this process (rule 10, the arrival margin) and its lag.
        self._due = -math.inf
        # The burst allowance of a policy with burst > 1: a token bucket that
        # refills one token per delay, up to the burst.
        self._tokens = float(config.burst)
        self._tokens_at = clock()
        # The host's token windows as this process estimates them (docs/signals.md,
        # "Token budgets"): the rules read them from responses, grants spend them.
        self.token_book = TokenBook()
        # The policy's extra windows ("10,000 a day"): the last `count` sends of each.
        self._window_sends: tuple[deque[float], ...] = tuple(
            deque(maxlen=count) for count, _ in config.windows
        )
        self._single = True
        self._plain_grant = False
        self.configure(config)

    def configure(self, config: SlotConfig) -> None:
        """Run with ``config`` from now on (``LiveSlot.configure``).

        It also keeps whether a grant has nothing but the usual to do: no
        window to count, a burst of 1, no jitter, and the jitter's factor 1
        already (most slots; :meth:`_admit` asks one flag for the four, at
        the spacing and at the grant). A factor left by a jitter set before
        stays for the gap begun with it: the next grant, not plain, sets it
        to 1 and makes the grants after it plain.
        """
        self.config = config
        self._single = config.burst == 1
        self._plain_grant = (
            not self._window_sends and self._single and not config.jitter and self._factor == 1.0
        )

    # -- what others read --------------------------------------------------------

    def in_flight(self) -> int:
        """Holds not yet released nor expired."""
        return self.in_flight_at(self.clock()) if self._holds else 0

    def in_flight_at(self, now: float) -> int:
        """:meth:`in_flight`, the clock read at ``now`` already (a policy's
        sample on the usual response, ``LiveSlot.respond``: a clock read fewer)."""
        if self._holds and now >= self.soonest:
            with self.lock:
                self.expire(now)
        return len(self._holds)

    def queued(self) -> int:
        """Tickets waiting."""
        return len(self._queue)

    def idle(self) -> bool:
        """Nothing queued or in flight, and no pause or budget still in force."""
        if self._queue or self.in_flight():
            return False
        now = self.clock()
        limits = self.state.limits
        return now >= limits.pause_until and now >= limits.budget_until

    def cap(self) -> int:
        """The most requests that may be in flight: ``max_concurrency``, or the
        policy's own estimate when it has one and it is lower."""
        cap = self.config.max_concurrency
        own = self.state.cache.in_flight_cap
        return own if 0 < own < cap else cap

    def send_at(self, now: float, cost: Cost | None = None) -> float:
        """The earliest time the next request (of ``cost`` tokens) may be sent,
        ignoring the cap (what :meth:`_admit` finds, granting nothing)."""
        self._admit(now, None, cost)
        return self._at

    def _admit(self, now: float, make: Callable[[float], H] | None, cost: Cost | None) -> H | None:
        """The spacing rules (``docs/scheduling.md``) and the grant, the lock held:
        the hold if the next request (of ``cost`` tokens) may go ``now`` (the cap
        aside) and there is a ``make``; else None, and when it may go in ``_at``.
        One home for both, in one call for the usual grant (:meth:`grant_now`):
        a rule the slot has no use for costs it a test, not a call."""
        state = self.state
        pace = state.pace
        limits = state.limits
        at = limits.pause_until
        last = self.last_send
        if self.arrivals is not None:  # else counts_from says `last`, without its call
            last = self.counts_from(last, self._grant_due, self._gap)
        if last is None:
            gap = self._gap = 0.0
            spaced = at
        else:
            # The delay; a gap once begun is not shortened by a delay that fell since (rule 3).
            gap = pace.delay
            if self._begun > gap:
                gap = self._begun
            if self._plain_grant and not pace.ramp_to:  # a factor of 1, a burst of 1, no window
                spaced = last + gap
            else:
                spaced, gap = self._paced_at(now, last, gap)
            if (limits.budget_gap > gap and now < limits.budget_until) or (
                limits.sustained_gap > gap and now < limits.sustained_until
            ):
                # A stated pace wider than the gap: the rule's one home, the fleet's too.
                spaced = max(spaced, limits.stated_next(last, now, gap))
            gap = self._gap = spaced - last if spaced > last else 0.0
            # Early by a grant's way to the wire, at most a quarter of the gap (rule 10).
            lead = self.lead
            if lead > 0.25 * gap:
                lead = 0.25 * gap
            if spaced - lead > at:
                at = spaced - lead
        if self.token_book.windows:
            at = max(at, TokenBudget.fits_at(self.token_book, cost, now))
        if now < at or make is None:
            self._at = at
            return None
        self.last_send = now
        # While the ramp-up bounds how fast the delay falls (a policy with one,
        # never refused), its fall runs on time, within a gap too (rule 3).
        if self.config.policy.ramp_up is not None and state.refusal.refused_gap <= 0.0:
            self._begun = 0.0
        else:
            self._begun = pace.delay
        if not self._plain_grant or self.arrivals is not None or cost:
            self._grant_extras(now, max(spaced, limits.pause_until), cost)
        state.counters.count_send(now)
        hold = make(now)
        hold.wire_gap = gap
        self._holds.add(hold)
        expires_at = hold.expires_at
        if expires_at < self.soonest:
            self.soonest = expires_at
        return hold

    def _paced_at(self, now: float, last: float, delay: float) -> tuple[float, float]:
        """:meth:`_admit`'s own spacing (the delay's) for a slot that is not
        plain: the jitter's factor, the ramp-up in force, a burst, a policy's
        windows. Returns when it lets the next send go, and the gap the
        headers' spacing is compared with (the jittered delay, or the ramp's)."""
        gap = delay * self._factor
        pace = self.state.pace
        if pace.ramp_to and 0.0 < pace.ramp_to < pace.delay:  # 0.0 (no ramp) asked once
            spaced = self._ramped_at(now, last)  # the headers' spacing holds too
            gap = spaced - last
        elif self._single:  # a burst of 1
            spaced = last + gap
        else:
            missing = 1.0 - self._burst_tokens(now)
            spaced = now + missing * delay if missing > 0 else -math.inf
        if self._window_sends:
            spaced = self._windows_at(spaced)
        return spaced, gap

    def _windows_at(self, at: float) -> float:
        """``at``, or later when a policy's window (``count`` sends in any
        ``seconds``) is full: its oldest send must leave it first."""
        for (count, seconds), sends in zip(self.config.windows, self._window_sends, strict=True):
            if len(sends) == count:
                at = max(at, sends[0] + seconds)
        return at

    def _ramped_at(self, now: float, last: float) -> float:
        """:meth:`_admit`'s spacing while the ramp-up lets the delay fall over time.

        The delay falls as :meth:`RampUp.delay_at <autothrottle._pace.RampUp.delay_at>`
        says, down to what the policy asked for (``docs/signals.md``,
        "Ramp-up"). The send time ``t`` solves ``t = last + delay(t)``;
        delay(t) falls as t grows, so bisection finds it.
        """
        pace = self.state.pace
        ramp_up = self.config.policy.ramp_up
        # Only a policy with a ramp-up sets ``ramp_to`` (a loaded record's is
        # dropped otherwise: ``SlotState.bound``), and a slot keeps its policy.
        assert ramp_up is not None
        ramp = RampUp(ramp_up)
        factor = self._factor

        def gap(t: float) -> float:
            return ramp.delay_at(pace, t) * factor

        low, high = now, last + gap(now)
        if high <= now:
            return high
        for _ in range(24):
            middle = (low + high) / 2.0
            if last + gap(middle) <= middle:
                high = middle
            else:
                low = middle
        return high

    # -- what the rules call when the state changed --------------------------------

    def wake(self) -> None:
        """Let the head re-check: something it may wait on changed.

        A head whose event loop has closed can never run again: it leaves the
        queue, and the next head is woken instead.
        """
        queue = self._queue
        while queue:
            head = queue[0]
            try:
                head.wake()
                return
            except RuntimeError:  # its loop is closed
                with self.lock:
                    if queue and queue[0] is head:
                        queue.popleft()

    def set_by_hand(self) -> None:
        """The delay is being set by hand: it applies to the gap already begun."""
        self._begun = 0.0

    # -- what the driver calls -----------------------------------------------------

    def grant_now(self, make: Callable[[float], H], cost: Cost | None = None) -> H | None:
        """The fast path: a hold at once if nobody is queued and the gate is open."""
        lock = self.lock
        lock.acquire()
        try:
            if self._queue:
                return None
            holds = self._holds
            if holds:  # none in flight is under any cap (one at least)
                # At cap() (without its call): max_concurrency, or the policy's own below it.
                held = len(holds)
                if (
                    held >= self.config.max_concurrency
                    or held >= self.state.cache.in_flight_cap > 0
                ) and not self._room_after_expiry():
                    return None
            # The clock taken into a local first: Python 3.11 looks a call on an
            # attribute that holds no method (a field, not a def) up the slow way.
            clock = self.clock
            return self._admit(clock(), make, cost)
        finally:
            lock.release()

    def _room_after_expiry(self) -> bool:
        """Whether the slot, at its cap by the holds kept, is under it once the
        holds past their ``hold_timeout`` are let go, the lock held: they no
        longer count (rule 5), and a ``try_acquire`` must not refuse the turn
        they left. Off the usual path: only a slot at its cap asks."""
        now = self.clock()
        if now < self.soonest:
            return False
        self.expire(now)
        return len(self._holds) < self.cap()

    def enqueue(self, cost: Cost | None = None) -> Ticket:
        """Join the queue (with the request's cost in tokens, if it has one)."""
        ticket = Ticket(cost)
        with self.lock:
            queue = self._queue
            if queue is _NO_QUEUE:
                queue = self._queue = deque()
            queue.append(ticket)
        return ticket

    def try_acquire(self, ticket: Ticket, make: Callable[[float], Hold]) -> float:
        """Grant ``ticket`` if it may go now.

        Returns 0.0 when granted (``ticket.hold`` is then set and the ticket
        has left the queue); otherwise the seconds after which it is worth
        checking again (``math.inf``: only when woken).
        """
        with self.lock:
            return self._try_acquire(ticket, make)

    def _try_acquire(self, ticket: Ticket, make: Callable[[float], Hold]) -> float:
        queue = self._queue
        while queue[0] is not ticket and not queue[0].alive():
            queue.popleft()  # a waiter whose event loop closed under it
        if queue[0] is not ticket:
            return math.inf
        now = self.clock()
        cap = self.cap()
        if len(self._holds) >= cap:
            self.expire(now)
            if len(self._holds) >= cap:
                self._due = -math.inf
                soonest = min(hold.expires_at for hold in self._holds)
                return max(soonest - now, 0.0) if math.isfinite(soonest) else math.inf
        hold = self._admit(now, make, ticket.cost)
        if hold is None:
            wait = self._at - now
            self._due = now + wait
            return wait
        if self._due > -math.inf:
            self.late(now - self._due)
            self._due = -math.inf
        self._queue.popleft()
        ticket.hold = hold
        self.wake()
        return 0.0

    def abandon(self, ticket: Ticket) -> Hold | None:
        """Forget a ticket whose request will not be sent (cancelled or failed).

        Returns the ticket's hold if it had already been granted: the caller
        must release that.
        """
        with self.lock:
            if ticket.hold is not None:
                return ticket.hold
            was_head = bool(self._queue) and self._queue[0] is ticket
            try:
                self._queue.remove(ticket)
            except ValueError:
                return None
            if was_head:
                self.wake()
            return None

    def release(self, hold: Hold) -> None:
        """Stop counting ``hold`` as in flight."""
        lock = self.lock
        lock.acquire()
        try:  # let_go's steps, without its call: on every request
            self._holds.discard(hold)
            clock = self.clock  # a local first, as in grant_now
            self.state.counters.touch(clock())
            if self._queue:  # wake()'s first check, without its call
                self.wake()
        finally:
            lock.release()

    def let_go(self, hold: Hold) -> None:
        """:meth:`release`, the lock held already, for a response that finished
        as it was applied (``_turns.Plain.answered``): applying it counted its
        time as the slot's last activity already, so there is no clock to read
        and nothing to touch."""
        self._holds.discard(hold)
        if self._queue:
            self.wake()

    # -- inside the gate -------------------------------------------------------------

    def _burst_tokens(self, now: float) -> float:
        burst = self.config.burst
        delay = self.state.pace.delay
        if delay <= 0.0:
            return float(burst)
        refill = (now - self._tokens_at) / delay
        return min(float(burst), self._tokens + refill)

    def _grant_extras(self, now: float, due: float, cost: Cost | None) -> None:
        """What a grant at ``now`` (due at ``due``: the gap's end, or a pause's)
        does beyond the usual, out of :meth:`_admit` so that the usual grant
        reads one test for all of it: for a strict pace, the due time rule 10
        counts from; a send in each policy window, a burst token, the next
        gap's jitter; the request's tokens. A plain slot with a strict pace or
        a cost comes here too: the steps it has no use for leave it as it was."""
        if self.arrivals is not None:
            self.granted(now, due)
        config = self.config
        if self._window_sends:  # the loop only when there are windows: no iterator made
            for sends in self._window_sends:
                sends.append(now)
        if config.burst > 1:
            self._tokens = self._burst_tokens(now) - 1.0
            self._tokens_at = now
        jitter = config.jitter
        if jitter:
            self._factor = 1.0 + jitter * (2.0 * self._rng.random() - 1.0)
        else:  # a jitter since turned off: its gap is over, and the grants plain again
            self._factor = 1.0
            self._plain_grant = not self._window_sends and self._single
        if cost:
            TokenBudget.spend(self.token_book, cost, now)

    def expire(self, now: float) -> None:
        """Let go of the holds whose time ran out by ``now``, the lock held:
        they stop counting as in flight (the usual response asks this before
        its step, which may count them)."""
        holds = self._holds
        if now < self.soonest or not holds:
            return
        expired = [hold for hold in holds if hold.expires_at <= now]
        for hold in expired:
            hold.expire()
            holds.discard(hold)
        self.soonest = min((hold.expires_at for hold in holds), default=math.inf)
