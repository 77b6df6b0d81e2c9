"""The rules: in which order a response, a failure or a signal asks the estimators.

This is the one place a slot's learned state changes after a request. It
holds no estimate of its own; it asks, in the order ``docs/signals.md`` and
``docs/recovery.md`` write down, the owner of each record:

* :class:`~autothrottle._counters.Counters`: count what happened;
* :class:`~autothrottle._limits.Budget`: pauses and rate-limit budgets;
* :class:`~autothrottle._recovery.Recovery`: the refusal memory and its floor,
  and :func:`~autothrottle._recovery.first_of_burst`, which signals count;
* :class:`~autothrottle._cache.CacheShare`: the miss share and the in-flight cap;
* the policy (:class:`~autothrottle._policy.DelayPolicy`): its next delay;
* :class:`~autothrottle._pace.RampUp`: how fast that delay may fall.

Then it sets the delay through :class:`~autothrottle._pace.Pace`, wakes the
slot's gate so a waiting request re-checks, and tells the listeners.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping
from typing import Concatenate, ParamSpec, TypeVar

from ._cache import CacheShare
from ._events import Listeners, ThrottleEvent
from ._headers import HeaderSignals, read_headers
from ._limits import Budget, rounding
from ._log import log_delay, log_pause, note, seconds_text
from ._policies import AutoThrottlePolicy
from ._policy import Sample, SlotConfig, new_sample
from ._recovery import Recovery, first_of_burst, refused_pace
from ._settings import Signals
from ._slot import LiveSlot
from ._state import SlotState
from ._tokens import TokenBudget
from ._validate import check_response

__all__ = ["BACKOFF_FLOOR", "Rules"]

_ANY_RESPONSE = AutoThrottlePolicy()
"""Scrapy's rule, for hits before the first miss (nothing is known of an origin yet)."""

BACKOFF_FLOOR = 0.05
"""The least delay a backoff leaves, in seconds (within ``max_delay``): a slot at
delay 0 that is refused, or whose connections fail, must slow down too, and
twice 0 is 0 (``docs/signals.md``)."""

P = ParamSpec("P")
R = TypeVar("R")


def _under_slot_lock(
    method: Callable[Concatenate[Rules, LiveSlot, P], R],
) -> Callable[Concatenate[Rules, LiveSlot, P], R]:
    """Run a rule holding the slot's lock: threads share slots (the sync client)."""

    @functools.wraps(method)
    def locked(self: Rules, slot: LiveSlot, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with slot.gate.lock:
            return method(self, slot, *args, **kwargs)

    return locked


class Rules:
    """The response rules of one throttle: its signal settings, its estimators, its listeners."""

    __slots__ = (
        "_budget",
        "_clock",
        "_reads_headers",
        "_tokens",
        "_wall_clock",
        "debug",
        "listeners",
        "recovery",
        "signals",
    )

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
        self._reads_headers = signals.reads_headers  # frozen: read once, not per response
        self.recovery = recovery
        self.debug = debug
        self._budget = Budget(signals.max_pause)
        self._tokens = TokenBudget(signals.max_pause)
        self._clock = clock
        self._wall_clock = wall_clock
        self.listeners = Listeners()

    # -- a response ------------------------------------------------------------------

    def observe(
        self,
        slot: LiveSlot,
        *,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None,
        adjust: bool,
        sent_at: float | None,
        from_cache: bool | None = None,
        granted: float = 0.0,
    ) -> None:
        """Apply one response: count it, read its headers, back off or adapt.

        ``from_cache=True`` (a client-side cache answered) makes the response a
        cache hit exactly as a cache header would; False and None leave that to
        the headers, since a cache further on may still have answered.
        ``granted``: the gap the request's grant kept after the one before it
        (0: not known), the pace a refusal of it answered when wider than the
        delay (:func:`~autothrottle._recovery.refused_pace`).
        """
        latency, status, fields = check_response(latency, status, headers, from_cache)
        # The lock taken here, not by a decorator or a `with`: this runs for
        # every response, and either costs as much as a good part of the rest.
        lock = slot.gate.lock
        lock.acquire()
        try:
            self._observe(slot, latency, status, fields, adjust, sent_at, from_cache, granted)
        finally:
            lock.release()

    def _observe(
        self,
        slot: LiveSlot,
        latency: float,
        status: int,
        fields: Mapping[str, str],
        adjust: bool,
        sent_at: float | None,
        from_cache: bool | None,
        granted: float = 0.0,
    ) -> None:
        now = self._clock()
        state = slot.state
        state.counters.count_response(status, latency, now)
        if self.listeners:
            self.listeners.tell(ThrottleEvent("response", slot.key, status, latency))
        cache_hit = from_cache is True
        signals = self.signals
        reason = (
            signals.backoff_reason(status, fields)
            if status in signals.backoff_statuses or signals.block_classifier is not None
            else None  # the usual answer, without a call
        )
        read, first = None, False  # first: the host states its pace for the first time
        if self._reads_headers:
            read = read_headers(status, fields, now=self._wall_clock(), from_cache=cache_hit)
            cache_hit = read.cache_hit
            first = read.rate_limit is not None and not state.limits.stated_gap(now)
        edge = kept = 0.0
        if reason is not None:  # at the pace the host was said to allow: a margin's step
            edge = self._edge_step(slot, read, sent_at, now)
            kept = edge or self._kept_gap(slot, read, sent_at, now, granted)
        if read is not None:
            said = read.retry_after is not None or read.rate_limit is not None or read.tokens
            if said or read.ignored:
                latest = (
                    math.inf
                    if reason is None
                    else self._pause_bound(slot, read, sent_at, kept, now)
                )
                self._apply_pacing_headers(
                    slot, read, now, sent_at, refused=status >= 400, latest=latest
                )
        if status < 400:  # a refusal, answered without the work, measures nothing else
            self._arrived(slot, read, sent_at, latency, now)
        if cache_hit:
            state.counters.count_cache_hit()
        if reason is not None:
            if edge:
                self._count_edge(slot, reason, latency, status)
            else:
                self._refused(slot, reason, read, sent_at, kept, now, latency, status, granted)
            return
        if status == 200 and not cache_hit:
            # What the host let through, adjusted or not: the lower bound of its limit.
            self.recovery.count_success(state.refusal, now)
        if adjust:
            start = self._stated_start(state, now) if first else 0.0
            self._adapt(slot, latency, status, cache_hit, now, start)

    def _arrived(
        self,
        slot: LiveSlot,
        read: HeaderSignals | None,
        sent_at: float | None,
        latency: float,
        now: float,
    ) -> None:
        """Tell the wire when this request reached the host, at the latest (a pace
        the headers just stated counts already), and what the host's count
        showed after it, unless other processes spend from that count too."""
        counts = self.signals.rate_limit_headers and slot.senders == 1
        budget = read.rate_limit if read is not None and counts else None
        slot.gate.answered(sent_at, latency, now, budget)

    @staticmethod
    def _stated_start(state: SlotState, now: float) -> float:
        """The pace the host's headers state, when below a delay it was never
        refused at (0.0: none): the policy adapts from it, not from that delay
        (``docs/signals.md``, "Rate-limit headers": a stated start)."""
        stated = state.limits.stated_gap(now)
        if stated < state.pace.delay and state.refusal.refused_gap <= 0.0:
            return stated
        return 0.0

    def _adapt(
        self,
        slot: LiveSlot,
        latency: float,
        status: int,
        cache_hit: bool,
        now: float,
        start: float = 0.0,
    ) -> None:
        """The policy's next delay, within the bounds every policy shares;
        ``start``: a pace the host just stated, adapted from in place of the
        delay when it is less (:meth:`_stated_start`)."""
        state = slot.state
        config = slot.config
        old = state.pace.delay
        by_share = cache_hit and status == 200 and not self.signals.cache_hits_lower_delay
        if by_share:
            new, reason = self._cache_hit_delay(state, old, latency, config), "cache hit"
            # Hits that got slow may raise the delay, as any response may; one
            # slow hit among fast ones (a client's stall) moves it a tenth of
            # the way: the averaged hit latency, this hit counted in.
            slow = state.cache.hit_latency / config.target_concurrency
            if slow > old:
                new = slow
        else:
            new = self._policy_delay(slot, latency, status, cache_hit, start or old)
            reason = "cache hit" if cache_hit else "latency"
        new = config.clamp(new)
        if not state.refusal.refused_gap <= 0.0:  # else no floor (floor() says 0.0)
            floor = self.recovery.floor(state.refusal, now)
            if new < floor:
                new = min(floor, config.max_delay)
                reason = "recovery floor"
        may_lower = status == 200 and (not cache_hit or self.signals.cache_hits_lower_delay)
        if not may_lower and new < old and not by_share:
            new = old
        ramp_to = 0.0
        ramp = config.policy.ramp_up
        # The ramp-up only ever holds a falling delay back: a delay kept or
        # raised skips it (most responses of a steady slot).
        if ramp is not None and new < old and state.refusal.refused_gap <= 0.0:
            held, ramp_to = slot.ramped(ramp, new, now)
            if held > new:
                # The gate keeps lowering it toward `ramp_to` as time passes, so a
                # slot whose next response is a long delay away is not stuck.
                new, reason = held, "ramp-up"
        if start and new < old:
            # The delay was a guess made before the host said its pace: the gap it
            # began is shortened too, as by a delay set by hand (scheduling rule 3).
            slot.gate.set_by_hand()
            reason = "stated pace"
        if state.pace.adapt(new, now, ramp_to=ramp_to):
            slot.gate.wake()
        if self.debug:
            log_delay(slot.key, slot.gate.in_flight(), old, new, reason, latency, status)

    @staticmethod
    def _policy_delay(
        slot: LiveSlot, latency: float, status: int, cache_hit: bool, previous: float
    ) -> float:
        """The policy's delay for a response that reached the origin, adapted from
        ``previous`` (the slot's delay, or a pace the host just stated).

        The policy paces the origin: it is handed the gap between requests that
        reach it (the delay over the miss share), and its answer is scaled back
        by the share, so that hits flow at the pace that keeps the origin where
        the policy wants it; a policy that caps requests in flight gets the
        cap's headroom on top, one that does not counts the hits in flight
        against its target (``docs/signals.md``, "Caches", "In-flight cap").
        """
        state = slot.state
        config = slot.config
        cache = state.cache
        share = cache.miss_share
        if share != 1.0 and not cache_hit:  # 1.0: no hit seen yet, a miss keeps it
            share = CacheShare.miss(cache, state.counters.responses)
        policy = config.policy
        memory = state.pace.policy_state
        gate = slot.gate
        sample = new_sample(latency, status, gate.in_flight(), cache_hit, memory, gate.lag)
        if share == 1.0:
            # No cache in front (most slots): the origin's pace is the slot's,
            # with no headroom and no hits to add, cap or none.
            delay = policy.next_delay(previous, sample, config)
        else:
            delay = Rules._paced_behind_cache(slot, share, sample)
        limit = policy.in_flight_limit(memory)  # as the sample left it
        if limit is not None and CacheShare.cap(cache, limit, max(delay, config.min_delay, 1e-6)):
            slot.gate.wake()
        return delay

    @staticmethod
    def _paced_behind_cache(slot: LiveSlot, share: float, sample: Sample) -> float:
        """:meth:`_policy_delay`'s delay when a cache answers a ``share`` of the sends."""
        state = slot.state
        config = slot.config
        policy = config.policy
        capped = policy.in_flight_limit(sample.state) is not None
        # A policy with no cap of its own keeps `target_concurrency` in flight at
        # the whole site, hits included: their share of the time in flight is
        # added to the pace, outside what the policy is handed.
        hits = (
            0.0 if capped else CacheShare.hit_time(state.cache, share) / config.target_concurrency
        )
        return CacheShare.pace_origin(
            share,
            state.pace.delay,
            lambda gap: policy.next_delay(gap, sample, config),
            capped=capped,
            hits=hits,
        )

    @staticmethod
    def _cache_hit_delay(state: SlotState, old: float, latency: float, config: SlotConfig) -> float:
        """A hit lowers the share of sends that reach the origin, and with it the delay.

        Before the first miss nothing is known of the origin, and a hit is
        paced as AutoThrottle paces any response (within the ramp-up): a site
        that is all hits must not stay at its start delay.
        """
        counters = state.counters
        moved = CacheShare.hit(state.cache, latency, counters.responses, old)
        if counters.responses - counters.cache_hits <= 0:
            return _ANY_RESPONSE.next_delay(old, Sample(latency, 200, 0), config)
        return moved

    # -- failures and backoffs ----------------------------------------------------------

    @_under_slot_lock
    def fail(self, slot: LiveSlot, error: BaseException, *, sent_at: float) -> None:
        """A request to ``slot`` failed without a response."""
        now = self._clock()
        slot.state.counters.count_failure(now)
        if self.listeners:
            self.listeners.tell(ThrottleEvent("failure", slot.key, reason=type(error).__name__))
        if self.signals.backoff_on_failure:
            self.backoff(slot, f"failure: {type(error).__name__}", sent_at, now)

    @_under_slot_lock
    def backoff(
        self,
        slot: LiveSlot,
        reason: str,
        sent_at: float | None,
        now: float,
        *,
        latency: float | None = None,
        status: int | None = None,
        kept: bool = False,
        asked: float = 0.0,
        granted: float = 0.0,
    ) -> bool:
        """Slow ``slot`` down, unless the signal is the lag of an earlier backoff.

        ``kept``: a 429 at a pace the host kept (none stated), which backs off no
        further than the recovery floor (``docs/recovery.md``). ``asked``: the
        pause the refusal asked for, which may say how slow the host is.
        ``granted``: the gap the refused request's grant kept (0: not known).
        Returns True if the slot backed off.
        """
        state = slot.state
        if not first_of_burst(sent_at, state.refusal.backoff_at):
            state.counters.count_backoff(reason, ignored=True)
            return False
        config = slot.config
        factor = self.signals.backoff_factor
        old = state.pace.delay
        pace = refused_pace(old, state.counters.last_latency, slot.gate.in_flight(), granted)
        new = max(config.policy.backoff_delay(pace, factor, config), old, BACKOFF_FLOOR)
        ramped = config.policy.ramp_up is not None
        self.recovery.refused(state.refusal, pace, now, ramped=ramped, factor=factor, asked=asked)
        if kept:
            new = min(new, max(old, self.recovery.floor(state.refusal, now), BACKOFF_FLOOR))
        new = config.clamp(new)
        state.counters.count_backoff(reason)
        if self.listeners:
            self.listeners.tell(ThrottleEvent("backoff", slot.key, reason=reason))
        if state.pace.set_delay(new):
            slot.gate.wake()
        if self.debug:
            log_delay(slot.key, slot.gate.in_flight(), old, new, reason, latency, status)
        return True

    @_under_slot_lock
    def pause(self, slot: LiveSlot, seconds: float, now: float, *, reason: str) -> None:
        """Send nothing to ``slot`` for ``seconds`` (bounded by ``max_pause``)."""
        max_pause = self.signals.max_pause
        if seconds > max_pause:
            text = (
                f"{reason} of {seconds_text(seconds)} capped to max_pause={seconds_text(max_pause)}"
            )
            note(slot.noted, slot.key, f"{reason} capped", text, logging.WARNING)
            seconds = max_pause
        if seconds <= 0.0 or not slot.state.limits.pause(now + seconds):
            return
        slot.state.counters.count_pause()
        slot.gate.wake()
        if self.debug:
            log_pause(slot.key, seconds, reason)

    @_under_slot_lock
    def adopt(self, slot: LiveSlot, delay: float | None, pause: float, now: float) -> None:
        """Take what the fleet learned (a shared store): its delay and pause."""
        state = slot.state
        changed = delay is not None and state.pace.set_delay(slot.config.clamp(delay))
        if pause > 0.0 and state.limits.pause(now + pause):
            changed = True
        if changed:
            slot.gate.wake()

    # -- inside the rules ---------------------------------------------------------------

    @staticmethod
    def _stated_gap(slot: LiveSlot, now: float) -> float:
        """The gap the slot was told its host allows (0: none): its policy's own
        fixed pace, ``min_delay``, or the pace the host's headers stated."""
        config = slot.config
        policy = config.policy
        gap = config.clamp(policy.initial_delay(config)) if policy.strict_spacing else 0.0
        return max(gap, config.min_delay, slot.state.limits.stated_gap(now))

    def _refused(
        self,
        slot: LiveSlot,
        reason: str,
        read: HeaderSignals | None,
        sent_at: float | None,
        kept: float,
        now: float,
        latency: float,
        status: int,
        granted: float,
    ) -> None:
        """A refusal that backs off: a 429 at a pace the host kept (``kept``, none
        stated) no further than the floor; the pause its ``Retry-After`` asks
        for (if obeyed), no longer than ``max_delay`` (a gap learned past it is
        clamped to it), may say how slow the host is (``docs/recovery.md``)."""
        floor = status == 429 and kept > 0.0 and not self._stated_gap(slot, now)
        asked = 0.0
        if read is not None and read.retry_after is not None and self.signals.retry_after:
            asked = min(read.retry_after, slot.config.max_delay)
        self.backoff(
            slot,
            reason,
            sent_at,
            now,
            latency=latency,
            status=status,
            kept=floor,
            asked=asked,
            granted=granted,
        )

    def _edge_step(
        self, slot: LiveSlot, read: HeaderSignals | None, sent_at: float | None, now: float
    ) -> float:
        """A refusal of a request sent at the stated pace, which the host let the
        slot keep until now: its arrival margin grows a step, and the stated gap
        is returned; 0.0 when the refusal is a real one (``docs/recovery.md``,
        "At the stated pace")."""
        gap = self._stated_gap(slot, now)
        if gap <= 0.0 or slot.state.pace.delay > gap:
            return 0.0
        if not self._kept(slot, read, sent_at, gap, now, stated=True):
            return 0.0
        return gap if slot.gate.widen_margin(gap) else 0.0

    def _pause_bound(
        self,
        slot: LiveSlot,
        read: HeaderSignals,
        sent_at: float | None,
        kept: float,
        now: float,
    ) -> float:
        """Seconds from ``now`` a refusal's pause may last (inf: no bound): one gap
        from the send at a pace the host kept (``kept``, that gap), as the rounding
        of a token due within it; no longer than its burst's first for the lag
        of an earlier pace (``docs/recovery.md``, "At a pace the host kept")."""
        if sent_at is None:
            return math.inf
        if kept:
            return max(0.0, sent_at + kept - now)
        state = slot.state
        if not first_of_burst(sent_at, state.refusal.backoff_at):
            if not rounding(read, state.pace.delay):
                return math.inf
            return max(0.0, state.limits.pause_until - now)
        return math.inf

    def _kept_gap(
        self,
        slot: LiveSlot,
        read: HeaderSignals | None,
        sent: float | None,
        now: float,
        granted: float,
    ) -> float:
        """The pace a refusal answered was sent at, if the host kept it lately; else 0.0."""
        state = slot.state
        last = state.counters.last_latency
        gap = refused_pace(state.pace.delay, last, slot.gate.in_flight(), granted)
        return gap if self._kept(slot, read, sent, gap, now, stated=False) else 0.0

    def _kept(
        self,
        slot: LiveSlot,
        read: HeaderSignals | None,
        sent_at: float | None,
        gap: float,
        now: float,
        *,
        stated: bool,
    ) -> bool:
        """Whether a refusal answered at ``now`` is of a request sent at a pace of
        ``gap`` (``stated``: one the host allows) the host let the slot keep lately
        (the first of its burst), and asks for no pause longer than the gap
        rounded up to the second."""
        state = slot.state
        if sent_at is None or gap <= 0.0 or not first_of_burst(sent_at, state.refusal.backoff_at):
            return False
        # In a fleet this process sees its share of the successes the host let through.
        if not self.recovery.let_through(state.refusal, gap * slot.senders, now, stated=stated):
            return False  # the host has not kept this pace: it is too fast
        return rounding(read, gap)

    def _count_edge(self, slot: LiveSlot, reason: str, latency: float, status: int) -> None:
        """Count a refusal that cost a margin step: a backoff, of a step."""
        slot.state.counters.count_backoff(reason)
        if self.listeners:
            self.listeners.tell(ThrottleEvent("backoff", slot.key, reason=reason))
        if self.debug:
            delay = slot.state.pace.delay
            in_flight = slot.gate.in_flight()
            log_delay(slot.key, in_flight, delay, delay, "arrival margin", latency, status)

    def _apply_pacing_headers(
        self,
        slot: LiveSlot,
        read: HeaderSignals,
        now: float,
        sent_at: float | None,
        *,
        refused: bool,
        latest: float = math.inf,
    ) -> None:
        """Pause or space the slot as the headers say; no pause lasts more than
        ``latest`` seconds from ``now`` (:meth:`_pause_bound`)."""
        for problem in read.ignored:
            text = str(problem)
            # The kind is the header's name: a value that changes with every
            # response (a count, a date) must not make every note a new kind.
            kind = text.partition(":")[0].partition(" ")[0].lower()
            note(slot.noted, slot.key, kind, text, logging.INFO)
        signals = self.signals
        if signals.retry_after and read.retry_after is not None:
            self.pause(slot, min(read.retry_after, latest), now, reason="Retry-After")
        budget = read.rate_limit
        if signals.rate_limit_headers and budget is not None:
            wait = self._budget.apply(slot.state.limits, budget, now, sent_at, refused=refused)
            if wait is None:
                slot.gate.wake()
            else:
                self.pause(slot, min(wait, latest), now, reason="rate-limit header")
        if signals.rate_limit_headers and read.tokens:
            book = slot.gate.token_book
            wait = self._tokens.read(book, read.tokens, now, sent_at, refused=refused)
            if wait is None:
                slot.gate.wake()
            else:
                self.pause(slot, wait, now, reason="token budget")
