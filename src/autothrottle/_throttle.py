"""The throttle: settings, slots, and the one place responses change delays."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from ._config import SlotConfig, check_bool, check_number, check_positive
from ._driver import wait_for_lease
from ._headers import HeaderSignals, read_headers
from ._hosts import HostTable
from ._policy import AutoThrottlePolicy, DelayPolicy, Sample
from ._request import host_key
from ._slot import Lease, Slot, SlotSnapshot
from ._store import MemoryStore, SlotStore

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["Throttle"]

logger = logging.getLogger("autothrottle")

KeyFunction = Callable[[str], str]
BlockClassifier = Callable[[int, Mapping[str, str]], bool]

_NO_HEADERS: Mapping[str, str] = {}


class Throttle:
    """Paces requests per slot (per host by default), adapting each slot's delay.

    One throttle may serve any number of clients, httpx and aiohttp alike; they
    then share slots. It is meant for one event loop (thread) at a time.

    The first eight arguments are Scrapy's AutoThrottle settings; the rest are
    keyword-only.

    Args:
        start_delay: Delay of a new slot, in seconds (Scrapy's
            ``AUTOTHROTTLE_START_DELAY``). A new slot starts at
            ``max(start_delay, min_delay)``, bounded by ``max_delay``.
        max_delay: The delay never rises above this (``AUTOTHROTTLE_MAX_DELAY``).
        target_concurrency: Requests to keep in flight per slot on average
            (``AUTOTHROTTLE_TARGET_CONCURRENCY``); must be > 0.
        min_delay: The delay never falls below this (``DOWNLOAD_DELAY``).
        max_concurrency: Hard cap of requests in flight per slot
            (``CONCURRENT_REQUESTS_PER_DOMAIN``).
        jitter: Each gap between sends is the delay times a factor drawn
            uniformly from ``[1 - jitter, 1 + jitter]`` once per send; 0 turns
            it off. Must be in ``[0, 1)``.
        debug: Log one record per delay change on the ``autothrottle`` logger,
            with its reason (``AUTOTHROTTLE_DEBUG``).
        key: A function from URL (str) to slot key. Default: the URL's host,
            lowercase and IDNA-encoded, without the port.
        policy: The delay policy; default :class:`AutoThrottlePolicy`.
        hosts: Per-host settings: an exact host or a glob (``*.example.com``)
            mapped to a :class:`HostSettings` or a dict of the same keys.
        backoff_statuses: Statuses that multiply the delay by
            ``backoff_factor`` (default 429 and 503).
        backoff_factor: How much a backoff slows the slot (>= 1).
        backoff_on_failure: Connection errors and timeouts back off too.
        retry_after: Obey ``Retry-After``: the slot sends nothing until then.
        rate_limit_headers: Obey ``RateLimit``/``RateLimit-*``/``X-RateLimit-*``.
        max_pause: The longest pause any header may impose, in seconds.
        cache_hits_lower_delay: Let the latency of cache hits (``Age`` > 0,
            ``X-Cache: HIT``, 304 …) lower the delay; off by default because
            a cache's speed says nothing about the origin.
        block_classifier: Called with each response's status and headers; True
            means a soft block, which backs the slot off.
        strict_scrapy: Scrapy's plain rules only: no backoff statuses, no
            failure backoff, no header reading, cache hits treated as any
            response. Overrides the signal settings above.
        hold_timeout: Seconds after which a request whose response was never
            finished (never read, never closed) stops counting as in flight.
        store: Where slots live; default a :class:`MemoryStore`.
        clock: Monotonic clock in seconds; inject one to test pacing.
        wall_clock: Epoch clock in seconds, for HTTP dates in headers.
        rng: Random source of the jitter factor; inject a seeded one to test.

    Raises:
        TypeError, ValueError: An argument has the wrong type or value; the
            message names the parameter and the value.
    """

    #: Right after a refusal the slot may come back to this fraction of the
    #: rate that was refused ...
    recovery_margin = 0.93
    #: ... reaching that rate again after this many seconds, along a cubic
    #: that is flat near it (as TCP CUBIC does): quick to return, slow to pass
    #: the point of the last refusal, faster again to probe beyond it.
    recovery_time = 15.0

    def __init__(
        self,
        start_delay: float = 5.0,
        max_delay: float = 60.0,
        target_concurrency: float = 1.0,
        min_delay: float = 0.0,
        max_concurrency: int = 8,
        jitter: float = 0.0,
        debug: bool = False,
        key: KeyFunction | None = None,
        *,
        policy: DelayPolicy | None = None,
        hosts: Mapping[str, object] | None = None,
        backoff_statuses: Collection[int] = (429, 503),
        backoff_factor: float = 2.0,
        backoff_on_failure: bool = True,
        retry_after: bool = True,
        rate_limit_headers: bool = True,
        max_pause: float = 300.0,
        cache_hits_lower_delay: bool = False,
        block_classifier: BlockClassifier | None = None,
        strict_scrapy: bool = False,
        hold_timeout: float = 300.0,
        store: SlotStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        if policy is None:
            policy = AutoThrottlePolicy()
        elif not isinstance(policy, DelayPolicy):
            raise TypeError(f"policy must be a DelayPolicy, got {policy!r}")
        self.config = SlotConfig.build(
            start_delay=start_delay,
            min_delay=min_delay,
            max_delay=max_delay,
            target_concurrency=target_concurrency,
            max_concurrency=max_concurrency,
            jitter=jitter,
            policy=policy,
        )
        self._hosts = HostTable(self.config, hosts)
        self.debug = check_bool("debug", debug)
        if key is not None and not callable(key):
            raise TypeError(f"key must be a callable from URL to slot key, got {key!r}")
        self._key = key

        if isinstance(backoff_statuses, (str, bytes)) or not isinstance(
            backoff_statuses, Collection
        ):
            raise TypeError(
                f"backoff_statuses must be a collection of ints, got {backoff_statuses!r}"
            )
        for status in backoff_statuses:
            if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
                raise ValueError(f"backoff_statuses must hold HTTP statuses, got {status!r}")
        self.backoff_factor = check_number("backoff_factor", backoff_factor, minimum=1.0)
        self.max_pause = check_number("max_pause", max_pause)
        strict = check_bool("strict_scrapy", strict_scrapy)
        self.strict_scrapy = strict
        self.backoff_statuses = frozenset() if strict else frozenset(backoff_statuses)
        self.backoff_on_failure = (
            check_bool("backoff_on_failure", backoff_on_failure) and not strict
        )
        self.retry_after = check_bool("retry_after", retry_after) and not strict
        self.rate_limit_headers = (
            check_bool("rate_limit_headers", rate_limit_headers) and not strict
        )
        self.cache_hits_lower_delay = (
            check_bool("cache_hits_lower_delay", cache_hits_lower_delay) or strict
        )
        if block_classifier is not None and not callable(block_classifier):
            raise TypeError(f"block_classifier must be callable, got {block_classifier!r}")
        self.block_classifier = None if strict else block_classifier

        if hold_timeout != math.inf:
            check_positive("hold_timeout", hold_timeout)
        self.hold_timeout = float(hold_timeout)
        if store is None:
            store = MemoryStore()
        elif not isinstance(store, SlotStore):
            raise TypeError(f"store must implement SlotStore, got {store!r}")
        self._store = store
        if not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds, got {clock!r}")
        if not callable(wall_clock):
            raise TypeError(f"wall_clock must be a callable returning seconds, got {wall_clock!r}")
        self._clock = clock
        self._wall_clock = wall_clock
        if rng is not None and not isinstance(rng, random.Random):
            raise TypeError(f"rng must be a random.Random, got {rng!r}")
        self._rng = rng if rng is not None else random.Random()

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Throttle(start_delay={c.start_delay}, max_delay={c.max_delay}, "
            f"target_concurrency={c.target_concurrency}, min_delay={c.min_delay}, "
            f"max_concurrency={c.max_concurrency}, jitter={c.jitter}, debug={self.debug}, "
            f"policy={c.policy!r}, strict_scrapy={self.strict_scrapy})"
        )

    # -- slots -------------------------------------------------------------------

    def key_for(self, url: str) -> str:
        """The slot key of a URL: ``key(url)`` if given, else its host."""
        if self._key is not None:
            result = self._key(url)
            if not isinstance(result, str) or not result:
                raise TypeError(f"key function must return a non-empty str, got {result!r}")
            return result
        return host_key(url)

    def slot(self, key: str) -> Slot:
        """The slot for ``key``, created on first use."""
        if not isinstance(key, str) or not key:
            raise TypeError(f"key must be a non-empty str, got {key!r}")
        return self._store.get_or_create(key, self._new_slot)

    def config_for(self, key: str) -> SlotConfig:
        """The settings a slot with this key gets (per-host settings applied)."""
        return self._hosts.config_for(key)

    def _new_slot(self, key: str) -> Slot:
        return Slot(
            key,
            self._hosts.config_for(key),
            clock=self._clock,
            rng=self._rng,
            hold_timeout=self.hold_timeout,
        )

    def slots(self) -> Iterator[Slot]:
        """Every slot the throttle holds now."""
        return iter(self._store)

    def snapshot(self) -> dict[str, SlotSnapshot]:
        """Every slot's state at once, keyed by slot key."""
        return {slot.key: slot.snapshot() for slot in self._store}

    # -- sending -----------------------------------------------------------------

    async def acquire(self, key: str, *, adjust: bool = True) -> Lease:
        """Wait for the turn of one request to slot ``key`` and take a lease.

        Returns at once when the slot is free; otherwise waits in FIFO order.
        Release the lease when the response is finished (it is a context
        manager). Cancelling the wait leaves nothing behind.
        """
        slot = self.slot(key)
        lease = slot._try_grant_now(self, adjust)
        if lease is not None:
            return lease
        return await wait_for_lease(slot, self, adjust)

    # -- learning ----------------------------------------------------------------

    def observe(
        self,
        key: str,
        *,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Apply one response to slot ``key``.

        Args:
            key: The slot key.
            latency: Seconds from connection ready to response headers.
            status: The response's HTTP status.
            headers: The response headers, for Retry-After, rate-limit and
                cache signals.
        """
        slot = self.slot(key)
        # Without a lease the send time is unknown: take the latest send, so a
        # repeated 429 with nothing sent in between counts once.
        sent_at = slot._last_send if slot._last_send is not None else -math.inf
        self._observe_slot(
            slot, latency=latency, status=status, headers=headers, adjust=True, sent_at=sent_at
        )

    def backoff(
        self, url_or_key: str, *, pause: float | None = None, sent_at: float | None = None
    ) -> bool:
        """Slow a slot down by hand: a CAPTCHA, a login wall, an empty page.

        The slot backs off as on a 429. Only the first signal of a burst
        counts: if ``sent_at`` (the :attr:`Lease.sent_at` of the request that
        saw the block) is before the slot's last backoff, or, without it, if
        the slot has sent nothing since its last backoff, the call is counted
        but changes nothing.

        Args:
            url_or_key: A URL (anything with ``://``) or a slot key.
            pause: Also send nothing to the slot for this many seconds
                (bounded by ``max_pause``).
            sent_at: When the blocked request was sent, on the throttle's clock.

        Returns:
            True if the slot backed off, False if the call was taken as the lag
            of an earlier backoff.
        """
        if not isinstance(url_or_key, str) or not url_or_key:
            raise TypeError(f"url_or_key must be a non-empty str, got {url_or_key!r}")
        key = self.key_for(url_or_key) if "://" in url_or_key else url_or_key
        slot = self.slot(key)
        now = self._clock()
        if pause is not None:
            seconds = check_number("pause", pause)
            self._pause(slot, seconds, now, reason="manual pause")
        if sent_at is not None:
            sent_at = check_number("sent_at", sent_at, minimum=-math.inf)
        else:
            sent_at = slot._last_send if slot._last_send is not None else -math.inf
        return self._backoff(slot, "manual", sent_at, now)

    def _fail_slot(self, slot: Slot, error: BaseException, *, sent_at: float) -> None:
        slot.failures += 1
        now = self._clock()
        slot.last_activity = now
        if self.backoff_on_failure:
            self._backoff(slot, f"failure: {type(error).__name__}", sent_at, now)

    def _observe_slot(
        self,
        slot: Slot,
        *,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None,
        adjust: bool,
        sent_at: float | None = None,
    ) -> None:
        latency = check_number("latency", latency)
        if isinstance(status, bool) or not isinstance(status, int):
            raise TypeError(f"status must be an int, got {status!r}")
        if not 100 <= status <= 599:
            raise ValueError(f"status must be an HTTP status in [100, 599], got {status!r}")
        now = self._clock()
        slot.responses += 1
        slot.status_counts[status] += 1
        slot.last_latency = latency
        slot.last_activity = now
        if headers is None:
            headers = _NO_HEADERS
        cache_hit = False
        if not self.strict_scrapy:
            signals = read_headers(status, headers, now=self._wall_clock())
            cache_hit = signals.cache_hit
            if cache_hit:
                slot.cache_hits += 1
            if signals.retry_after is not None or signals.rate_limit is not None or signals.ignored:
                self._apply_pacing_headers(slot, signals, now)

        reason = None
        if status in self.backoff_statuses:
            reason = f"status {status}"
        elif self.block_classifier is not None and self.block_classifier(status, headers):
            reason = "blocked"
        if reason is not None:
            self._backoff(slot, reason, sent_at, now, latency=latency, status=status)
            return
        if status == 200 and not cache_hit:
            # What the host let through, adjusted or not: the lower bound of its limit.
            slot._count_success(now)
        if not adjust:
            return

        config = slot.config
        old = slot.delay
        sample = Sample(
            latency=latency,
            status=status,
            in_flight=slot.in_flight,
            cache_hit=cache_hit,
            state=slot.policy_state,
        )
        new = config.clamp(config.policy.next_delay(old, sample, config))
        floor = self._refusal_floor(slot, now)
        if new < floor:
            new = min(floor, config.max_delay)
        may_lower = status == 200 and (not cache_hit or self.cache_hits_lower_delay)
        if not may_lower and new < old:
            new = old
        slot._set_delay(new)
        if self.debug:
            self._log(slot, old, new, "cache hit" if cache_hit else "latency", latency, status)

    # -- the shared rules ----------------------------------------------------------

    def _refusal_floor(self, slot: Slot, now: float) -> float:
        """The smallest delay the slot may use since it was last refused.

        With ``W`` the refused rate, ``K = recovery_time`` and
        ``b = 1 - recovery_margin``, the allowed rate ``t`` seconds after the
        refusal is ``W * (1 + b * (t / K - 1) ** 3)``: ``(1 - b) W`` at once,
        ``W`` after ``K`` seconds (with a long flat stretch around it), then
        rising ever faster beyond, so a host whose limit went up is found again.
        """
        refused = slot.refused_gap
        if refused <= 0.0:
            return 0.0
        phase = max(0.0, now - slot.backoff_at) / self.recovery_time - 1.0
        return refused / (1.0 + (1.0 - self.recovery_margin) * phase**3)

    def _backoff(
        self,
        slot: Slot,
        reason: str,
        sent_at: float | None,
        now: float,
        *,
        latency: float | None = None,
        status: int | None = None,
    ) -> bool:
        if sent_at is not None and sent_at < slot.backoff_at:
            slot.ignored_backoffs += 1
            return False
        config = slot.config
        old = slot.delay
        # The pace that was refused: the delay, or, when the cap rather than the
        # delay was what held the slot back, latency / in-flight (Little's law).
        pace = old
        if slot.last_latency and slot.in_flight:
            pace = max(pace, slot.last_latency / slot.in_flight)
        new = config.clamp(config.policy.backoff_delay(pace, self.backoff_factor, config))
        new = max(new, old)
        # The host's limit lies between what it let through lately (a lower
        # bound) and the pace it refused (an upper one). Far apart, take their
        # geometric mean, a step of binary search, so a few refusals pin the
        # limit down even when the first came at several times it; close
        # together, the lower bound is the limit.
        # The lower bound is the best rate seen let through at a refusal in the
        # last minute: right after a pause the recent rate reads low.
        refused_gap = pace
        allowed = slot._success_rate(now) or 0.0
        if now - slot._allowed_at < 60.0:
            allowed = max(allowed, slot._allowed)
        if allowed > 0.0:
            slot._allowed = allowed
            slot._allowed_at = now
            if 1.0 / allowed > 1.25 * pace:
                refused_gap = math.sqrt(pace / allowed)
            else:  # refused just above what got through: that is the limit
                refused_gap = max(pace, 1.0 / allowed)
        slot.refused_gap = refused_gap
        slot.backoff_at = now
        slot.backoff_reason = reason
        slot.backoffs += 1
        slot._set_delay(new)
        if self.debug:
            self._log(slot, old, new, reason, latency, status)
        return True

    def _pause(self, slot: Slot, seconds: float, now: float, *, reason: str) -> None:
        if seconds > self.max_pause:
            logger.warning(
                "slot %s: %s of %.0fs capped to max_pause=%.0fs",
                slot.key,
                reason,
                seconds,
                self.max_pause,
            )
            seconds = self.max_pause
        if seconds > 0.0 and slot._set_pause(now + seconds) and self.debug:
            logger.debug(
                "slot=%s paused for %.0fms reason=%s",
                slot.key,
                seconds * 1000,
                reason,
                extra={"slot": slot.key, "pause": seconds, "reason": reason},
            )

    def _apply_pacing_headers(self, slot: Slot, signals: HeaderSignals, now: float) -> None:
        for note in signals.ignored:
            logger.info("slot %s: %s", slot.key, note)
        if self.retry_after and signals.retry_after is not None:
            self._pause(slot, signals.retry_after, now, reason="Retry-After")
        budget = signals.rate_limit
        if self.rate_limit_headers and budget is not None:
            slot.rate_limit = budget
            if budget.remaining <= 0:
                self._pause(slot, budget.reset, now, reason="rate-limit header")
            else:
                slot._set_budget(budget.spacing, now + min(budget.reset, self.max_pause))

    def _log(
        self,
        slot: Slot,
        old: float,
        new: float,
        reason: str,
        latency: float | None,
        status: int | None,
    ) -> None:
        in_flight = slot.in_flight
        logger.debug(
            "slot=%s in_flight=%d delay=%.0fms->%.0fms (%+.0fms) latency=%s status=%s reason=%s",
            slot.key,
            in_flight,
            old * 1000,
            new * 1000,
            (new - old) * 1000,
            "-" if latency is None else f"{latency * 1000:.0f}ms",
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
