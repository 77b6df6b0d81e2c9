"""A slot: the per-host pacing state and its FIFO gate, with no I/O.

Everything here is synchronous and reads time only through the injected
clock, so the scheduling rules can be tested by setting the clock by hand.
Waiting is the driver's business (:mod:`autothrottle._driver`): it parks a
:class:`_Ticket` in the slot's queue, asks :meth:`Slot._try_acquire` how long
to wait, and sleeps until then or until the slot wakes the ticket.

The rules:

* Requests leave in FIFO order: only the ticket at the head of the queue may
  be granted, and a request that finds an empty queue and an open gate goes at
  once without queueing.
* The head may go when fewer than ``max_concurrency`` leases are held and the
  current delay, times the jitter factor drawn at the previous send, has passed
  since that send. The delay is read when the head checks, so a response that
  lowers it lets the queue go sooner (the slot wakes the head on every change).
* The head is woken when anything it waits on changes: a grant (a new head),
  a release, a delay change, an abandoned head.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._config import SlotConfig, check_number

if TYPE_CHECKING:
    from types import TracebackType

    from ._headers import RateLimit
    from ._throttle import Throttle

__all__ = ["Lease", "Slot", "SlotSnapshot"]

Clock = Callable[[], float]

_RATE_WINDOW = 2.0
"""Seconds over which the success rate is averaged (the time constant)."""


def _no_wake() -> None:
    return None


class _Ticket:
    """A request waiting in a slot's queue.

    ``wake`` is set by the driver to whatever resumes the waiting task.
    """

    __slots__ = ("lease", "wake")

    def __init__(self) -> None:
        self.wake: Callable[[], None] = _no_wake
        self.lease: Lease | None = None


@dataclass(frozen=True, slots=True)
class SlotSnapshot:
    """A consistent, read-only view of one slot at one moment.

    Attributes:
        key: The slot's key (usually the host).
        delay: The current delay between sends, in seconds.
        in_flight: Requests sent and not yet finished.
        queued: Requests waiting for their turn.
        last_latency: The latency of the last observed response, or None.
        sent: Requests sent through the slot so far.
        responses: Responses observed so far.
        failures: Requests that failed without a response.
        status_counts: Responses observed, by status code.
        cache_hits: Responses a cache answered (their latency never lowers the delay).
        backoffs: Backoff signals that slowed the slot down.
        ignored_backoffs: Backoff signals ignored as the lag of an earlier one
            (answers to requests sent before the slot last backed off).
        pauses: Times the slot was paused (Retry-After, exhausted budget, manual).
        last_backoff_ago: Seconds since the slot last backed off, or None.
        last_backoff_reason: Why it last backed off (``"status 429"``,
            ``"failure: ConnectError"``, ``"manual"``, ``"blocked"``), or None.
        pause_remaining: Seconds until the slot may send again after a pause (0 if
            not paused).
        rate_limit: The last rate-limit budget a response advertised, or None.
    """

    key: str
    delay: float
    in_flight: int
    queued: int
    last_latency: float | None
    sent: int
    responses: int
    failures: int
    status_counts: Mapping[int, int] = field(default_factory=dict)
    cache_hits: int = 0
    backoffs: int = 0
    ignored_backoffs: int = 0
    pauses: int = 0
    last_backoff_ago: float | None = None
    last_backoff_reason: str | None = None
    pause_remaining: float = 0.0
    rate_limit: RateLimit | None = None


class Slot:
    """The pacing state of one key (usually one host).

    Get one from :meth:`Throttle.slot <autothrottle.Throttle.slot>`; do not
    build it yourself. ``delay`` may be set by hand, for example to seed a slot
    with a delay learned in an earlier run; the policy keeps adjusting it from
    there.
    """

    __slots__ = (
        "_allowed",
        "_allowed_at",
        "_budget_gap",
        "_budget_until",
        "_clock",
        "_config",
        "_delay",
        "_factor",
        "_last_send",
        "_leases",
        "_ok_first",
        "_ok_rate",
        "_ok_rate_at",
        "_queue",
        "_rng",
        "_tokens",
        "_tokens_at",
        "backoff_at",
        "backoff_reason",
        "backoffs",
        "cache_hits",
        "failures",
        "hold_timeout",
        "ignored_backoffs",
        "key",
        "last_activity",
        "last_latency",
        "pause_until",
        "pauses",
        "policy_state",
        "rate_limit",
        "refused_gap",
        "responses",
        "sent",
        "status_counts",
    )

    def __init__(
        self,
        key: str,
        config: SlotConfig,
        *,
        clock: Clock,
        rng: random.Random,
        hold_timeout: float = math.inf,
    ) -> None:
        self.key = key
        self._config = config
        self._clock = clock
        self._rng = rng
        self.hold_timeout = hold_timeout
        self._delay = config.clamp(config.policy.initial_delay(config))
        self._queue: deque[_Ticket] = deque()
        self._leases: set[Lease] = set()
        self._last_send: float | None = None
        self._factor = 1.0
        self.last_latency: float | None = None
        self.last_activity = clock()
        self.sent = 0
        self.responses = 0
        self.failures = 0
        self.cache_hits = 0
        self.backoffs = 0
        self.ignored_backoffs = 0
        self.pauses = 0
        # Send gate beyond the delay: a pause (Retry-After, exhausted budget)
        # and the spacing a rate-limit header asked for, until its reset.
        self.pause_until = -math.inf
        self._budget_gap = 0.0
        self._budget_until = -math.inf
        self.rate_limit: RateLimit | None = None
        # The burst allowance of a policy with burst > 1: a token bucket that
        # refills one token per delay, up to the burst.
        self._tokens = float(config.burst)
        self._tokens_at = self.last_activity
        # What the slot learned from being refused: when, why, and at what pace.
        self.backoff_at = -math.inf
        self.backoff_reason: str | None = None
        self.refused_gap = 0.0
        # An exponentially weighted rate of successful responses: what the host
        # actually let through lately, the best estimate of its limit when it refuses.
        self._allowed = 0.0  # the best success rate seen at a refusal lately
        self._allowed_at = -math.inf
        self._ok_first = -math.inf
        self._ok_rate = 0.0
        self._ok_rate_at = 0.0
        self.policy_state: dict[str, float] = {}
        self.status_counts: Counter[int] = Counter()

    # -- public view -------------------------------------------------------------

    @property
    def config(self) -> SlotConfig:
        """The settings this slot runs with."""
        return self._config

    @property
    def delay(self) -> float:
        """Seconds between two sends to this slot (before jitter)."""
        return self._delay

    @delay.setter
    def delay(self, value: float) -> None:
        self._set_delay(check_number("delay", value))

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet finished (body read or response closed)."""
        if self._leases:
            self._expire_leases(self._clock())
        return len(self._leases)

    @property
    def queued(self) -> int:
        """Requests waiting for their turn."""
        return len(self._queue)

    @property
    def idle(self) -> bool:
        """True when the slot may be forgotten without losing a promise to the host.

        Nothing queued or in flight, and no pause or rate-limit budget still in
        force: forgetting a paused slot would let the next request go at once.
        """
        if self._queue or self.in_flight:
            return False
        now = self._clock()
        return now >= self.pause_until and now >= self._budget_until

    def snapshot(self) -> SlotSnapshot:
        """The slot's state now, as an immutable record."""
        now = self._clock()
        return SlotSnapshot(
            key=self.key,
            delay=self._delay,
            in_flight=self.in_flight,
            queued=len(self._queue),
            last_latency=self.last_latency,
            sent=self.sent,
            responses=self.responses,
            failures=self.failures,
            status_counts=dict(self.status_counts),
            cache_hits=self.cache_hits,
            backoffs=self.backoffs,
            ignored_backoffs=self.ignored_backoffs,
            pauses=self.pauses,
            last_backoff_ago=(now - self.backoff_at if math.isfinite(self.backoff_at) else None),
            last_backoff_reason=self.backoff_reason,
            pause_remaining=max(0.0, self.pause_until - now),
            rate_limit=self.rate_limit,
        )

    def __repr__(self) -> str:
        return (
            f"<Slot {self.key!r} delay={self._delay:.3f}s "
            f"in_flight={len(self._leases)} queued={len(self._queue)}>"
        )

    # -- scheduling (driven by autothrottle._driver) -----------------------------

    def _set_delay(self, delay: float) -> None:
        if delay != self._delay:
            self._delay = delay
            self._wake_head()

    def _wake_head(self) -> None:
        if self._queue:
            self._queue[0].wake()

    def _send_at(self, now: float) -> float:
        """The earliest time the next request may be sent, ignoring the cap."""
        last = self._last_send
        if last is None:
            return self.pause_until
        gap = self._delay * self._factor
        burst = self._config.burst
        if burst == 1:
            at = last + gap
        else:
            missing = 1.0 - self._burst_tokens(now)
            at = now + missing * self._delay if missing > 0 else -math.inf
        if self._budget_gap > gap and now < self._budget_until:
            # Spread the advertised budget until its reset; after it, the budget is spent.
            at = max(at, min(last + self._budget_gap, self._budget_until))
        return max(at, self.pause_until)

    def _set_pause(self, until: float) -> bool:
        """Hold every send until ``until``; True if that extends the current pause."""
        if until <= self.pause_until:
            return False
        self.pause_until = until
        self.pauses += 1
        self._wake_head()
        return True

    def _count_success(self, now: float) -> None:
        if self._ok_first == -math.inf:
            self._ok_first = now
            self._ok_rate_at = now
        self._ok_rate = self._ok_rate * math.exp((self._ok_rate_at - now) / _RATE_WINDOW)
        self._ok_rate += 1.0 / _RATE_WINDOW
        self._ok_rate_at = now

    def _success_rate(self, now: float) -> float | None:
        """Successful responses per second lately, or None before there is a fair estimate."""
        warm = 1.0 - math.exp((self._ok_first - now) / _RATE_WINDOW)
        if warm < 0.3:
            return None
        return self._ok_rate * math.exp((self._ok_rate_at - now) / _RATE_WINDOW) / warm

    def _burst_tokens(self, now: float) -> float:
        burst = self._config.burst
        if self._delay <= 0.0:
            return float(burst)
        refill = (now - self._tokens_at) / self._delay
        return min(float(burst), self._tokens + refill)

    def _set_budget(self, gap: float, until: float) -> None:
        self._budget_gap = gap
        self._budget_until = until
        self._wake_head()

    def _grant(self, now: float, throttle: Throttle, adjust: bool) -> Lease:
        self._last_send = now
        if self._config.burst > 1:
            self._tokens = self._burst_tokens(now) - 1.0
            self._tokens_at = now
        jitter = self._config.jitter
        self._factor = 1.0 + jitter * (2.0 * self._rng.random() - 1.0) if jitter else 1.0
        self.sent += 1
        self.last_activity = now
        lease = Lease(self, throttle, now, now + self.hold_timeout, adjust)
        self._leases.add(lease)
        return lease

    def _try_grant_now(self, throttle: Throttle, adjust: bool) -> Lease | None:
        """The fast path: a lease at once if nobody is queued and the gate is open."""
        if self._queue or len(self._leases) >= self._config.max_concurrency:
            return None
        now = self._clock()
        if now < self._send_at(now):
            return None
        return self._grant(now, throttle, adjust)

    def _enqueue(self) -> _Ticket:
        ticket = _Ticket()
        self._queue.append(ticket)
        return ticket

    def _try_acquire(self, ticket: _Ticket, throttle: Throttle, adjust: bool) -> float:
        """Grant ``ticket`` if it may go now.

        Returns 0.0 when granted (``ticket.lease`` is then set and the ticket
        has left the queue); otherwise the seconds after which it is worth
        checking again (``math.inf``: only when woken).
        """
        if self._queue[0] is not ticket:
            return math.inf
        now = self._clock()
        if len(self._leases) >= self._config.max_concurrency:
            self._expire_leases(now)
            if len(self._leases) >= self._config.max_concurrency:
                soonest = min(lease.expires_at for lease in self._leases)
                return max(soonest - now, 0.0) if math.isfinite(soonest) else math.inf
        wait = self._send_at(now) - now
        if wait > 0:
            return wait
        self._queue.popleft()
        ticket.lease = self._grant(now, throttle, adjust)
        self._wake_head()
        return 0.0

    def _abandon(self, ticket: _Ticket) -> None:
        """Forget a ticket whose request will not be sent (cancelled or failed)."""
        if ticket.lease is not None:
            ticket.lease.release()
            return
        was_head = bool(self._queue) and self._queue[0] is ticket
        try:
            self._queue.remove(ticket)
        except ValueError:
            return
        if was_head:
            self._wake_head()

    def _release(self, lease: Lease) -> None:
        self._leases.discard(lease)
        self.last_activity = self._clock()
        self._wake_head()

    def _expire_leases(self, now: float) -> None:
        expired = [lease for lease in self._leases if lease.expires_at <= now]
        for lease in expired:
            lease._released = True
            self._leases.discard(lease)


class Lease:
    """One request's hold on its slot, from send until its response is finished.

    The adapters take and release leases for you. Use one directly to throttle
    a client autothrottle has no adapter for::

        with await throttle.acquire("example.com") as lease:
            response = await send()
            lease.observe(latency=response.elapsed, status=response.status)

    ``release`` is idempotent. A lease never released stops counting as in
    flight after the throttle's ``hold_timeout``.
    """

    __slots__ = ("__weakref__", "_released", "_throttle", "adjust", "expires_at", "sent_at", "slot")

    def __init__(
        self, slot: Slot, throttle: Throttle, sent_at: float, expires_at: float, adjust: bool
    ) -> None:
        self.slot = slot
        self._throttle = throttle
        self.sent_at = sent_at
        self.expires_at = expires_at
        self.adjust = adjust
        self._released = False

    @property
    def released(self) -> bool:
        """True once the lease no longer counts as in flight."""
        return self._released

    def observe(
        self,
        *,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Apply this request's response to its slot (unless ``adjust`` is off)."""
        self._throttle._observe_slot(
            self.slot,
            latency=latency,
            status=status,
            headers=headers,
            adjust=self.adjust,
            sent_at=self.sent_at,
        )

    def fail(self, error: BaseException) -> None:
        """Record that the request failed without a response (refused, reset, timed out).

        A failure gives no latency sample. Cancellation is not a failure: just
        release the lease.
        """
        self._throttle._fail_slot(self.slot, error, sent_at=self.sent_at)

    def release(self) -> None:
        """Stop counting the request as in flight; safe to call more than once."""
        if not self._released:
            self._released = True
            self.slot._release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
