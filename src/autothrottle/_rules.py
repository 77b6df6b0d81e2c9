"""The rules that turn a response, a failure or a signal into a slot's new state.

This is the one place a slot's learned state changes after a request: the
policy's next delay, the shared bounds on it (``docs/signals.md``), backoffs,
pauses, rate-limit budgets and the refusal memory (``docs/recovery.md``). It
writes the :class:`~autothrottle._state.SlotState` record and then wakes the
slot's gate, so a waiting request re-checks at once.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

from ._headers import HeaderSignals, RateLimit, read_headers
from ._policies import AutoThrottlePolicy
from ._policy import Sample, SlotConfig, ramp_period
from ._recovery import Recovery
from ._settings import Signals
from ._slot import Slot
from ._state import SlotState
from ._validate import check_number

__all__ = ["Rules"]

logger = logging.getLogger("autothrottle")

_NO_HEADERS: Mapping[str, str] = {}

_SHARE_WEIGHT = 0.01
"""Least weight of one response in the averaged miss share (about the last 100
responses; the first ones weigh 1/n, so the share starts as the plain mean). A
one-in-ten miss share read from 20 responses swings threefold, and the delay
swings with it."""

_ANY_RESPONSE = AutoThrottlePolicy()
"""Scrapy's rule, for hits before the first miss (nothing is known of an origin yet)."""

_HIT_WEIGHT = 0.1
"""Weight of one hit in the averaged hit latency."""

_SUSTAINED_MARGIN = 1.02
"""Sends at a policy's own pace are spaced this much wider: timer noise never packs
one more request into a window than the quota allows."""

_MIN_SHARE = 0.01
"""The miss share never reads lower: a cache that answers everything still has an origin."""


_MAX_NOTED = 32
"""Kinds of header problem remembered per slot (a hostile server cannot grow it)."""


def _share_weight(state: SlotState) -> float:
    """The weight of this response in the miss share: 1/n for the first ones."""
    return max(_SHARE_WEIGHT, 1.0 / max(1, state.responses))


def _seconds(value: float) -> str:
    """Seconds for a log line: whole above 10 s, else with the digits that matter."""
    return f"{value:.0f}s" if value >= 10 else f"{value:.3g}s"


def _ms(seconds: float) -> str:
    """Milliseconds with enough digits that a small change does not read as none."""
    ms = seconds * 1000.0
    if abs(ms) >= 100.0:
        return f"{ms:.0f}ms"
    if abs(ms) >= 10.0:
        return f"{ms:.1f}ms"
    return f"{ms:.2f}ms"


@dataclass(frozen=True, slots=True)
class ThrottleEvent:
    """One thing that happened to a slot, for listeners (metrics, logs).

    Attributes:
        kind: ``"response"``, ``"failure"`` or ``"backoff"``.
        slot: The slot key.
        status: The response's status (responses only).
        latency: The response's latency in seconds (responses only).
        reason: Why the slot backed off (``"status 429"``, ``"blocked"`` ...),
            or the failure's exception name.
    """

    kind: str
    slot: str
    status: int | None = None
    latency: float | None = None
    reason: str | None = None


Listener = Callable[[ThrottleEvent], None]


P = ParamSpec("P")
R = TypeVar("R")


def _under_slot_lock(
    method: Callable[Concatenate[Rules, Slot, P], R],
) -> Callable[Concatenate[Rules, Slot, P], R]:
    """Run a rule holding the slot's lock: threads share slots (the sync client)."""

    @functools.wraps(method)
    def locked(self: Rules, slot: Slot, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with slot.gate.lock:
            return method(self, slot, *args, **kwargs)

    return locked


BACKOFF_FLOOR = 0.05
"""The least delay a backoff leaves, in seconds (within ``max_delay``): a slot at
delay 0 that is refused, or whose connections fail, must slow down too, and
twice 0 is 0 (``docs/signals.md``)."""


class Rules:
    """The response rules of one throttle: its signal settings and refusal memory."""

    __slots__ = ("_clock", "_wall_clock", "debug", "listeners", "recovery", "signals")

    def __init__(
        self,
        signals: Signals,
        recovery: Recovery,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        debug: bool,
    ) -> None:
        self.signals = signals
        self.recovery = recovery
        self.debug = debug
        self._clock = clock
        self._wall_clock = wall_clock
        self.listeners: list[Listener] = []

    # -- a response ------------------------------------------------------------------

    @_under_slot_lock
    def observe(
        self,
        slot: Slot,
        *,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None,
        adjust: bool,
        sent_at: float | None,
        from_cache: bool | None = None,
    ) -> None:
        """Apply one response: count it, read its headers, back off or adapt.

        ``from_cache=True`` (a client-side cache answered) makes the response a
        cache hit exactly as a cache header would; False and None leave that to
        the headers, since a cache further on may still have answered.
        """
        latency = check_number("latency", latency)
        if isinstance(status, bool) or not isinstance(status, int):
            raise TypeError(f"status must be an int, got {status!r}")
        if from_cache is not None and not isinstance(from_cache, bool):
            raise TypeError(f"from_cache must be a bool or None, got {from_cache!r}")
        if headers is None:
            headers = _NO_HEADERS
        elif type(headers) is not dict and not isinstance(headers, Mapping):
            raise TypeError(f"headers must be a mapping of str to str, got {headers!r}")
        now = self._clock()
        state = slot.state
        state.responses += 1
        state.status_counts[status] += 1
        state.count_latency(latency)
        if self.listeners:
            self._tell(ThrottleEvent("response", slot.key, status, latency))
        state.last_latency = latency
        state.last_activity = now
        signals = self.signals
        cache_hit = from_cache is True
        if signals.reads_headers:
            read = read_headers(status, headers, now=self._wall_clock(), from_cache=cache_hit)
            cache_hit = read.cache_hit
            if read.retry_after is not None or read.rate_limit is not None or read.ignored:
                self._apply_pacing_headers(slot, read, now, sent_at, refused=status >= 400)
        if cache_hit:
            state.cache_hits += 1

        reason = None
        if status in signals.backoff_statuses:
            reason = f"status {status}"
        elif signals.block_classifier is not None and signals.block_classifier(status, headers):
            reason = "blocked"
        if reason is not None:
            self.backoff(slot, reason, sent_at, now, latency=latency, status=status)
            return
        if status == 200 and not cache_hit:
            # What the host let through, adjusted or not: the lower bound of its limit.
            self.recovery.count_success(state, now)
        if adjust:
            self._adapt(slot, latency, status, cache_hit, now)

    def _adapt(self, slot: Slot, latency: float, status: int, cache_hit: bool, now: float) -> None:
        """The policy's next delay, within the bounds every policy shares."""
        state = slot.state
        config = slot.config
        old = state.delay
        by_share = cache_hit and status == 200 and not self.signals.cache_hits_lower_delay
        if by_share:
            new, reason = self._cache_hit_delay(state, old, latency, config), "cache hit"
            slow = latency / config.target_concurrency
            if slow > old:  # a slow hit may raise the delay, as any response may
                new = slow
        else:
            new = self._policy_delay(slot, latency, status, cache_hit)
            reason = "cache hit" if cache_hit else "latency"
        new = config.clamp(new)
        floor = self.recovery.floor(state, now)
        if new < floor:
            new = min(floor, config.max_delay)
            reason = "recovery floor"
        ramp = config.policy.ramp_up
        state.ramp_to = 0.0
        if ramp is not None and new < old and state.refused_gap <= 0.0:
            slowest = old * 2.0 ** (-max(0.0, now - state.adjusted_at) / ramp_period(ramp, old))
            if new < slowest:
                # The gate keeps lowering it toward `new` as time passes, so a
                # slot whose next response is a long delay away is not stuck.
                state.ramp_to = new
                new, reason = slowest, "ramp-up"
        may_lower = status == 200 and (not cache_hit or self.signals.cache_hits_lower_delay)
        if not may_lower and new < old and not by_share:
            new = old
        state.adjusted_at = now
        self._set_delay(slot, new)
        if self.debug:
            self._log(slot, old, new, reason, latency, status)

    def _policy_delay(self, slot: Slot, latency: float, status: int, cache_hit: bool) -> float:
        """The policy's delay for a response that reached the origin.

        The policy paces the origin: it is handed the gap between requests that
        reach it (the delay over the miss share), and its answer is scaled back
        by the share, so that hits flow at the pace that keeps the origin where
        the policy wants it; a policy that caps requests in flight gets the
        cap's headroom on top (``docs/signals.md``, "Caches", "In-flight cap").
        """
        state = slot.state
        config = slot.config
        share = state.miss_share
        if not cache_hit:
            share = state.miss_share = share + _share_weight(state) * (1.0 - share)
        sample = Sample(
            latency=latency,
            status=status,
            in_flight=slot.gate.in_flight(),
            cache_hit=cache_hit,
            state=state.policy_state,
        )
        policy = config.policy
        # Misses come at random among the sends: paced at exactly the origin's
        # mean, a run of hits leaves it idle and a run of misses crowds it. A
        # policy that caps requests in flight holds the origin to its limit,
        # so its pace gets headroom for the hits' share (up to twice the rate).
        capped = policy.in_flight_limit(state.policy_state) is not None
        headroom = (1.0 + share) / 2.0 if capped else 1.0
        origin_gap = policy.next_delay(state.delay / (share * headroom), sample, config)
        delay = origin_gap * share * headroom
        limit = policy.in_flight_limit(state.policy_state)  # as the sample left it
        if limit is not None:
            # The limit is the origin's; hits in flight come on top (Little's
            # law: hit send rate x hit latency).
            hits = (1.0 - share) * state.hit_latency / max(delay, config.min_delay, 1e-6)
            cap = max(1, math.ceil(limit + hits - 1e-9))
            if cap > state.in_flight_cap > 0:
                slot.gate.wake()
            state.in_flight_cap = cap
        return delay

    @staticmethod
    def _cache_hit_delay(state: SlotState, old: float, latency: float, config: SlotConfig) -> float:
        """A hit lowers the share of sends that reach the origin, and with it the delay.

        Before the first miss nothing is known of the origin, and a hit is
        paced as AutoThrottle paces any response (within the ramp-up): a site
        that is all hits must not stay at its start delay.
        """
        hit_latency = state.hit_latency
        state.hit_latency = (
            latency if hit_latency <= 0.0 else (hit_latency + _HIT_WEIGHT * (latency - hit_latency))
        )
        share = state.miss_share
        new_share = max(_MIN_SHARE, share - _share_weight(state) * share)
        state.miss_share = new_share
        if state.responses - state.cache_hits <= 0:
            return _ANY_RESPONSE.next_delay(old, Sample(latency, 200, 0), config)
        return old * new_share / share

    # -- failures and backoffs ----------------------------------------------------------

    @_under_slot_lock
    def fail(self, slot: Slot, error: BaseException, *, sent_at: float) -> None:
        """A request to ``slot`` failed without a response."""
        state = slot.state
        state.failures += 1
        if self.listeners:
            self._tell(ThrottleEvent("failure", slot.key, reason=type(error).__name__))
        now = self._clock()
        state.last_activity = now
        if self.signals.backoff_on_failure:
            self.backoff(slot, f"failure: {type(error).__name__}", sent_at, now)

    @_under_slot_lock
    def backoff(
        self,
        slot: Slot,
        reason: str,
        sent_at: float | None,
        now: float,
        *,
        latency: float | None = None,
        status: int | None = None,
    ) -> bool:
        """Slow ``slot`` down, unless the signal is the lag of an earlier backoff.

        Returns True if the slot backed off.
        """
        state = slot.state
        if sent_at is not None and sent_at < state.backoff_at:
            state.ignored_backoffs += 1
            return False
        config = slot.config
        old = state.delay
        # The pace that was refused: the delay, or, when the cap rather than the
        # delay was what held the slot back, latency / in-flight (Little's law).
        pace = old
        in_flight = slot.gate.in_flight()
        if state.last_latency and in_flight:
            pace = max(pace, state.last_latency / in_flight)
        new = config.policy.backoff_delay(pace, self.signals.backoff_factor, config)
        new = config.clamp(max(new, old, BACKOFF_FLOOR))
        self.recovery.refused(state, pace, now, self.signals.backoff_factor)
        state.backoff_reason = reason
        state.backoff_reasons[reason] += 1
        state.backoffs += 1
        if self.listeners:
            self._tell(ThrottleEvent("backoff", slot.key, reason=reason))
        self._set_delay(slot, new)
        if self.debug:
            self._log(slot, old, new, reason, latency, status)
        return True

    @_under_slot_lock
    def pause(self, slot: Slot, seconds: float, now: float, *, reason: str) -> None:
        """Send nothing to ``slot`` for ``seconds`` (bounded by ``max_pause``)."""
        max_pause = self.signals.max_pause
        if seconds > max_pause:
            self._note(
                slot,
                f"{reason} capped",
                f"{reason} of {_seconds(seconds)} capped to max_pause={_seconds(max_pause)}",
                logging.WARNING,
            )
            seconds = max_pause
        if seconds <= 0.0:
            return
        state = slot.state
        until = now + seconds
        if until <= state.pause_until:
            return
        state.pause_until = until
        state.pauses += 1
        slot.gate.wake()
        if self.debug:
            logger.debug(
                "slot=%s paused for %.0fms reason=%s",
                slot.key,
                seconds * 1000,
                reason,
                extra={"slot": slot.key, "pause": seconds, "reason": reason},
            )

    @_under_slot_lock
    def adopt(self, slot: Slot, delay: float | None, pause: float, now: float) -> None:
        """Take what the fleet learned (a shared store): its delay and pause."""
        if delay is not None:
            self._set_delay(slot, slot.config.clamp(delay))
        if pause > 0.0 and now + pause > slot.state.pause_until:
            slot.state.pause_until = now + pause
            slot.gate.wake()

    # -- inside the rules ---------------------------------------------------------------

    def _tell(self, event: ThrottleEvent) -> None:
        """Hand ``event`` to every listener; a failing listener is logged, never raised."""
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("autothrottle: listener %r failed on %r", listener, event)

    @staticmethod
    def _set_delay(slot: Slot, delay: float) -> None:
        state = slot.state
        if delay != state.delay:
            state.delay = delay
            slot.gate.wake()

    def _apply_pacing_headers(
        self, slot: Slot, read: HeaderSignals, now: float, sent_at: float | None, *, refused: bool
    ) -> None:
        for note in read.ignored:
            text = str(note)
            # The kind is the header's name: a value that changes with every
            # response (a count, a date) must not make every note a new kind.
            kind = text.partition(":")[0].partition(" ")[0].lower()
            self._note(slot, kind, text, logging.INFO)
        signals = self.signals
        if signals.retry_after and read.retry_after is not None:
            self.pause(slot, read.retry_after, now, reason="Retry-After")
        budget = read.rate_limit
        if signals.rate_limit_headers and budget is not None:
            self._apply_budget(slot, budget, now, sent_at, refused=refused)

    def _apply_budget(
        self, slot: Slot, budget: RateLimit, now: float, sent_at: float | None, *, refused: bool
    ) -> None:
        """Pace by an advertised budget (``docs/signals.md``, "Rate-limit headers")."""
        state = slot.state
        state.rate_limit = budget
        sustained = budget.sustained
        if budget.remaining <= 0:
            wait = budget.reset
            if (
                not refused
                and sustained is not None
                and wait <= math.ceil(sustained * _SUSTAINED_MARGIN)
            ):
                # The last unit went to a request sent at the policy's own pace,
                # and t is no later than one such gap rounded up to the second:
                # the window ends within that gap of the send, not at the
                # second t rounds to (nor one gap after the response).
                since = 0.0 if sent_at is None else max(0.0, now - sent_at)
                wait = min(wait, max(0.0, sustained * _SUSTAINED_MARGIN - since))
            self.pause(slot, wait, now, reason="rate-limit header")
            return
        spacing = budget.spacing
        if budget.reset >= 1.0 and budget.reset.is_integer():
            # Whole seconds, rounded up by the server: the reset may be a second nearer.
            spacing = (budget.reset - 1.0) / budget.remaining
        state.budget_gap = spacing
        state.budget_until = now + min(budget.reset, self.signals.max_pause)
        # With several windows, the long-run pace is the slowest window's.
        paced = budget.slowest
        sustained = paced.sustained
        if sustained is not None:
            state.sustained_gap = sustained * _SUSTAINED_MARGIN
            horizon = max(budget.reset, paced.window or 0.0)
            state.sustained_until = now + min(horizon, self.signals.max_pause)
        slot.gate.wake()

    @staticmethod
    def _note(slot: Slot, kind: str, text: str, level: int) -> None:
        """Log a header problem once per slot and kind at ``level``, then at DEBUG.

        A server that sends the same bad header on every response must not
        flood the log; the first one is worth a look.
        """
        seen = slot.noted
        if kind in seen or len(seen) >= _MAX_NOTED:
            level = logging.DEBUG
        else:
            seen.add(kind)
        if logger.isEnabledFor(level):
            logger.log(level, "slot %s: %s", slot.key, text, extra={"slot": slot.key})

    def _log(
        self,
        slot: Slot,
        old: float,
        new: float,
        reason: str,
        latency: float | None,
        status: int | None,
    ) -> None:
        in_flight = slot.gate.in_flight()
        if new == old:
            change = f"{_ms(new)} (unchanged)"
        else:
            sign = "+" if new > old else "-"
            change = f"{_ms(old)}->{_ms(new)} ({sign}{_ms(abs(new - old))})"
        logger.debug(
            "slot=%s in_flight=%d delay=%s latency=%s status=%s reason=%s",
            slot.key,
            in_flight,
            change,
            "-" if latency is None else _ms(latency),
            "-" if status is None else status,
            reason,
            extra={
                "slot": slot.key,
                "in_flight": in_flight,
                "old_delay": old,
                "new_delay": new,
                "latency": latency,
                "status": status,
                "reason": reason,
            },
        )
