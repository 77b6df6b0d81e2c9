"""The throttle: settings, slots, and the one place responses change delays."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ._config import SlotConfig, check_bool, check_number, check_positive
from ._driver import wait_for_lease
from ._policy import AutoThrottlePolicy, DelayPolicy, Sample
from ._request import host_key
from ._slot import Lease, Slot, SlotSnapshot
from ._store import MemoryStore, SlotStore

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["Throttle"]

logger = logging.getLogger("autothrottle")

KeyFunction = Callable[[str], str]


class Throttle:
    """Paces requests per slot (per host by default), adapting each slot's delay.

    One throttle may serve any number of clients, httpx and aiohttp alike; they
    then share slots. It is meant for one event loop (thread) at a time.

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
        debug: Log one record per adjusted response on the ``autothrottle``
            logger (``AUTOTHROTTLE_DEBUG``).
        key: A function from URL (str) to slot key. Default: the URL's host,
            lowercase and IDNA-encoded, without the port.
        policy: The delay policy; default :class:`AutoThrottlePolicy`.
        hold_timeout: Seconds after which a request whose response was never
            finished (never read, never closed) stops counting as in flight.
        store: Where slots live; default a :class:`MemoryStore`.
        clock: Monotonic clock in seconds; inject one to test pacing.
        rng: Random source of the jitter factor; inject a seeded one to test.

    Raises:
        TypeError, ValueError: An argument has the wrong type or value; the
            message names the parameter and the value.
    """

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
        hold_timeout: float = 300.0,
        store: SlotStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if policy is None:
            policy = AutoThrottlePolicy()
        elif not isinstance(policy, DelayPolicy):
            raise TypeError(f"policy must implement DelayPolicy, got {policy!r}")
        self.config = SlotConfig.build(
            start_delay=start_delay,
            min_delay=min_delay,
            max_delay=max_delay,
            target_concurrency=target_concurrency,
            max_concurrency=max_concurrency,
            jitter=jitter,
            policy=policy,
        )
        self.debug = check_bool("debug", debug)
        if key is not None and not callable(key):
            raise TypeError(f"key must be a callable from URL to slot key, got {key!r}")
        self._key = key
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
        self._clock = clock
        if rng is not None and not isinstance(rng, random.Random):
            raise TypeError(f"rng must be a random.Random, got {rng!r}")
        self._rng = rng if rng is not None else random.Random()

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Throttle(start_delay={c.start_delay}, max_delay={c.max_delay}, "
            f"target_concurrency={c.target_concurrency}, min_delay={c.min_delay}, "
            f"max_concurrency={c.max_concurrency}, jitter={c.jitter}, debug={self.debug}, "
            f"policy={c.policy!r})"
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

    def _new_slot(self, key: str) -> Slot:
        return Slot(
            key, self.config, clock=self._clock, rng=self._rng, hold_timeout=self.hold_timeout
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
        """Apply one response to the delay of slot ``key``.

        Args:
            key: The slot key.
            latency: Seconds from connection ready to response headers.
            status: The response's HTTP status.
            headers: The response headers (reserved for header-aware rules).
        """
        self._observe_slot(
            self.slot(key), latency=latency, status=status, headers=headers, adjust=True
        )

    def _fail_slot(self, slot: Slot, error: BaseException, *, adjust: bool) -> None:
        slot.failures += 1
        slot.last_activity = self._clock()

    def _observe_slot(
        self,
        slot: Slot,
        *,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None,
        adjust: bool,
    ) -> None:
        latency = check_number("latency", latency)
        if isinstance(status, bool) or not isinstance(status, int):
            raise TypeError(f"status must be an int, got {status!r}")
        slot.responses += 1
        slot.status_counts[status] += 1
        slot.last_latency = latency
        slot.last_activity = self._clock()
        if not adjust:
            return
        config = slot.config
        old = slot.delay
        sample = Sample(latency=latency, status=status, in_flight=slot.in_flight)
        new = config.clamp(config.policy.next_delay(old, sample, config))
        if status != 200 and new < old:
            new = old
        slot._set_delay(new)
        if self.debug:
            logger.debug(
                "slot=%s in_flight=%d delay=%.0fms->%.0fms (%+.0fms) latency=%.0fms status=%d",
                slot.key,
                sample.in_flight,
                old * 1000,
                new * 1000,
                (new - old) * 1000,
                latency * 1000,
                status,
                extra={
                    "slot": slot.key,
                    "in_flight": sample.in_flight,
                    "old_delay": old,
                    "new_delay": new,
                    "latency": latency,
                    "status": status,
                },
            )
