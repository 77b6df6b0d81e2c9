"""The throttle: the public facade over settings, slots, the gate and the rules.

It validates its arguments once, then routes: a request's turn to the slot's
gate (through the driver, the one place that awaits), a response to the rules.
It holds no rule of its own; see ``docs/architecture.md`` for the layers.
"""

from __future__ import annotations

import inspect
import math
import random
import time
from collections.abc import Callable, Collection, Coroutine, Generator, Iterator, Mapping
from types import CoroutineType, TracebackType
from typing import Any

from ._events import ThrottleEvent
from ._hosts import HostSettings
from ._lease import Lease
from ._parts import KeyFunction, assemble
from ._policies import AdaptiveConcurrencyPolicy, AutoThrottlePolicy
from ._policy import DelayPolicy, SlotConfig
from ._recovery import Recovery
from ._request import Cost, check_cost, host_key
from ._settings import BlockClassifier, Signals
from ._slot import LiveSlot, Slot, SlotSnapshot
from ._stats import Collector, ThrottleStats, collect, in_chunks
from ._store import SlotStore
from ._turns import Maker, Turns
from ._validate import check_int, check_number, keywords_only

__all__ = ["Acquiring", "Throttle", "check_throttle", "missing_throttle", "throttle_hint"]


def _signal(name: str, doc: str) -> Any:
    """A read-only property for one of the frozen signal settings."""
    return property(lambda self: getattr(self._rules.signals, name), doc=doc)


def _default_policy(strict_scrapy: object) -> DelayPolicy:
    """The policy of a throttle given none: Scrapy's in strict mode, else the adaptive one."""
    return AutoThrottlePolicy() if strict_scrapy is True else AdaptiveConcurrencyPolicy()


def _positional_hint(cls: type, args: tuple[object, ...], kwargs: dict[str, object]) -> str | None:
    """Throttle(2.0): which keyword a positional value was likely meant for."""
    if not args:
        return None
    value = args[0]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        guess = (
            f"Throttle(min_delay={value!r}) for at least {value!r} s between requests, "
            f"or Throttle(start_delay={value!r}) for the first delay of each host"
        )
    elif isinstance(value, DelayPolicy):
        guess = f"Throttle(policy={value!r})"
    elif isinstance(value, SlotStore):
        guess = f"Throttle(store={value!r})"
    else:
        guess = "Throttle(min_delay=..., max_delay=..., ...)"
    return f"Throttle takes keyword arguments only, got {value!r} positionally: {guess}?"


@keywords_only(_positional_hint)
class Throttle:
    """Paces requests per slot (per host by default), adapting each slot's delay.

    One throttle may serve any number of clients, httpx and aiohttp alike, sync
    and async; they then share slots. It is thread-safe: several threads, each
    with its own event loop or none, may use it at once.

    Every argument is keyword-only (``Throttle(2.0)`` would be ambiguous: the
    first eight are Scrapy's AutoThrottle settings, named as Scrapy names them).
    The settings are validated once and read-only afterwards.

    Args:
        start_delay: Delay of a new slot, in seconds (Scrapy's
            ``AUTOTHROTTLE_START_DELAY``). A new slot starts at
            ``max(start_delay, min_delay)``, bounded by ``max_delay``. None
            (the default): the policy's own, 1 s for
            :class:`AdaptiveConcurrencyPolicy` (its ramp-up reaches a fast
            host within seconds), 5 s (Scrapy's) for the others.
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
        policy: The delay policy. Default: :class:`AdaptiveConcurrencyPolicy`,
            the one setting the benchmarks hold to every goal; with
            ``strict_scrapy=True``, :class:`AutoThrottlePolicy`. Scrapy's own
            rules are ``Throttle(policy=AutoThrottlePolicy())`` (with its 5 s
            start).
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
        recovery_margin: Right after a refusal the slot may come back to this
            fraction of the refused rate, in (0, 1] (see ``docs/recovery.md``).
        recovery_time: Seconds until the slot may reach the refused rate again.
        hold_timeout: Seconds after which a request whose response was never
            finished (never read, never closed) stops counting as in flight.
        max_wait: The longest a request may wait for its turn, in seconds;
            past it the request fails with :class:`ThrottleTimeout` and nothing
            is sent. None (the default) waits as long as the host asks.
            ``acquire(max_wait=...)`` and httpx's pool timeout bound one request.
        store: Where slots live; default a :class:`MemoryStore`.
        clock: Monotonic clock in seconds; inject one to test pacing.
            An ``autothrottle.testing.VirtualClock`` also skips the waits.
        wall_clock: Epoch clock in seconds, for HTTP dates in headers.
        rng: Random source of the jitter factor; inject a seeded one to test.

    Raises:
        TypeError, ValueError: An argument has the wrong type or value; the
            message names the parameter and the value.
    """

    def __init__(
        self,
        *,
        start_delay: float | None = None,
        max_delay: float = 60.0,
        target_concurrency: float = 1.0,
        min_delay: float = 0.0,
        max_concurrency: int = 8,
        jitter: float = 0.0,
        debug: bool = False,
        key: KeyFunction | None = None,
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
        recovery_margin: float = 0.93,
        recovery_time: float = 15.0,
        hold_timeout: float = 300.0,
        max_wait: float | None = None,
        store: SlotStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        config = self._config = SlotConfig.build(
            start_delay=start_delay,
            min_delay=min_delay,
            max_delay=max_delay,
            target_concurrency=target_concurrency,
            max_concurrency=max_concurrency,
            jitter=jitter,
            policy=_default_policy(strict_scrapy) if policy is None else policy,
            max_wait=max_wait,
        )
        signals = Signals.build(
            backoff_statuses=backoff_statuses,
            backoff_factor=backoff_factor,
            backoff_on_failure=backoff_on_failure,
            retry_after=retry_after,
            rate_limit_headers=rate_limit_headers,
            max_pause=max_pause,
            cache_hits_lower_delay=cache_hits_lower_delay,
            block_classifier=block_classifier,
            strict_scrapy=strict_scrapy,
            hold_timeout=hold_timeout,
        )
        recovery = Recovery(recovery_margin, recovery_time)
        self._key, self._clock, self._hosts, self._rules, self._table, self._fleet = assemble(
            config, hosts, signals, recovery, debug, key, clock, wall_clock, store, rng, start_delay
        )
        self._turns = Turns(self._rules, self._fleet, self._clock, self)

    @property
    def max_wait(self) -> float | None:
        """The longest a request waits for its turn, or None for no bound."""
        return self._config.max_wait

    def __repr__(self) -> str:
        c = self._config
        return (
            f"Throttle(start_delay={c.start_delay}, max_delay={c.max_delay}, "
            f"target_concurrency={c.target_concurrency}, min_delay={c.min_delay}, "
            f"max_concurrency={c.max_concurrency}, jitter={c.jitter}, debug={self.debug}, "
            f"policy={c.policy!r}, strict_scrapy={self.strict_scrapy})"
        )

    # -- settings (read-only) -----------------------------------------------------------

    @property
    def config(self) -> SlotConfig:
        """The slot settings of every host without per-host settings."""
        return self._config

    @property
    def debug(self) -> bool:
        """Whether each delay change is logged with its reason."""
        return self._rules.debug

    @property
    def recovery_margin(self) -> float:
        """The fraction of a refused rate a slot may come back to at once."""
        return self._rules.recovery.margin

    @property
    def recovery_time(self) -> float:
        """Seconds until a slot may reach a refused rate again."""
        return self._rules.recovery.time

    @property
    def store(self) -> SlotStore:
        """Where the slots' learned state is kept."""
        return self._table.store

    backoff_statuses = _signal("backoff_statuses", "Statuses that back a slot off.")
    backoff_factor = _signal("backoff_factor", "How much a backoff slows the slot.")
    backoff_on_failure = _signal("backoff_on_failure", "Whether failures back off.")
    retry_after = _signal("retry_after", "Whether Retry-After pauses the slot.")
    rate_limit_headers = _signal("rate_limit_headers", "Whether rate-limit headers are obeyed.")
    max_pause = _signal("max_pause", "The longest pause a header may impose.")
    cache_hits_lower_delay = _signal(
        "cache_hits_lower_delay", "Whether cache hits may lower the delay."
    )
    block_classifier = _signal("block_classifier", "The soft-block classifier, or None.")
    strict_scrapy = _signal("strict_scrapy", "Whether only Scrapy's plain rules apply.")
    hold_timeout = _signal("hold_timeout", "Seconds a never-finished request counts.")

    # -- slots -------------------------------------------------------------------------

    def key_for(self, url: object, *, host: str | None = None) -> str:
        """The slot key of a URL: ``key(url)`` if a key function was given, else its host.

        Args:
            url: The URL, as a str or any object whose ``str()`` is the URL (it
                is only turned into a str for a key function).
            host: The URL's host, when the caller has it already: saves parsing.
        """
        if self._key is not None:
            result = self._key(str(url))
            if not isinstance(result, str) or not result:
                raise TypeError(f"key function must return a non-empty str, got {result!r}")
            return result
        return host_key(host if host is not None else str(url))

    def slot(self, key: str) -> Slot:
        """The slot for ``key``, created on first use."""
        return self._live(key).view

    def _live(self, key: str) -> LiveSlot:
        """The engine's parts of slot ``key``, created on first use (the table
        checks the key)."""
        return self._table.get_or_create(key)

    def config_for(self, key: str) -> SlotConfig:
        """The settings a slot with this key gets (per-host settings applied)."""
        return self._hosts.config_for(key)

    def set_host(self, host: str, settings: HostSettings | Mapping[str, object]) -> None:
        """Settings for one host (or a glob such as ``*.example.com``) from now on.

        The same as an entry of ``hosts=`` given at construction, for what is
        learned while running: a robots.txt ``Crawl-delay`` is a ``min_delay``
        (``autothrottle fetch`` sets it so). It replaces any settings given
        before for the same pattern. Slots made from now on get it; a live slot
        of a matching key takes it at once, its delay brought within the new
        bounds, except a new ``policy``, which only slots made later get (what a
        slot learned belongs to its policy).

        Raises:
            TypeError, ValueError: a bad pattern or setting, named in the message.
        """
        self._hosts.set(host, settings)
        for slot in self._table:
            config = self._hosts.config_for(slot.key)
            if config is not slot.config:
                slot.configure(config)

    def slots(self) -> Iterator[Slot]:
        """Every live slot of the throttle now."""
        return (live.view for live in self._table)

    def snapshot(self) -> dict[str, SlotSnapshot]:
        """Every slot's state at once, keyed by slot key."""
        return {live.key: live.view.snapshot() for live in self._table}

    def stats(self, *, top: int | None = None) -> ThrottleStats:
        """What the throttle has done, per slot and in total, as plain data.

        Args:
            top: Keep the rows of the ``top`` busiest slots only (by requests
                sent); the totals still count every slot.

        It reads every slot (about 2 µs of CPU each with ``top``, 6 µs a row
        without: ``docs/observability.md``); in a running event loop with very
        many slots, prefer :meth:`stats_async`.
        """
        if top is not None:
            top = check_int("top", top, minimum=0)
        return collect(self._table, top)

    async def stats_async(self, *, top: int | None = None, chunk: int = 1000) -> ThrottleStats:
        """:meth:`stats`, yielding to the event loop every ``chunk`` slots."""
        if top is not None:
            top = check_int("top", top, minimum=0)
        collector = Collector(top)
        async for slot in in_chunks(self._table, check_int("chunk", chunk, minimum=1)):
            collector.add(slot)
        return collector.result()

    async def snapshot_async(self, *, chunk: int = 1000) -> dict[str, SlotSnapshot]:
        """:meth:`snapshot`, yielding to the event loop every ``chunk`` slots."""
        slots = in_chunks(self._table, check_int("chunk", chunk, minimum=1))
        return {slot.key: slot.view.snapshot() async for slot in slots}

    def listen(self, listener: Callable[[ThrottleEvent], None]) -> Callable[[], None]:
        """Call ``listener`` with a :class:`ThrottleEvent` for every response,
        failure and backoff; returns a function that stops it.

        Listeners run inline, under the slot's lock: keep them quick (count,
        enqueue). An exception from one is logged and ignored.
        """
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {listener!r}")
        return self._rules.listeners.add(listener)

    def evict_idle(self) -> int:
        """Forget every slot idle for the store's ``idle_timeout`` now; return how many.

        The throttle also does this by itself, a bounded batch at a time, as
        slots are used; call this to sweep the whole table at once.
        """
        return self._table.evict_idle()

    # -- sending -----------------------------------------------------------------------

    def acquire(
        self,
        key: str,
        *,
        adjust: bool = True,
        max_wait: float | None = None,
        cost: Cost | Mapping[str, float] | None = None,
    ) -> Acquiring:
        """Wait for the turn of one request to slot ``key`` and take a lease.

        Await it for the lease (``lease = await throttle.acquire(key)``), or
        enter it to hold the lease for a block, released on leaving::

            async with throttle.acquire("example.com") as lease:
                response = await send()
                lease.observe(latency=response.elapsed, status=response.status)

        The turn comes at once when the slot is free; otherwise requests wait
        in FIFO order. Release an awaited lease when the response is finished
        (it is a context manager too). Cancelling the wait leaves nothing
        behind. What it returns (an :class:`Acquiring`) is a coroutine: a task
        may run it.

        ``cost`` is the request's weight in tokens, for a host that advertises
        token budgets (an LLM API): a number, or ``{"input": ..., "output":
        ...}``; the turn comes when it fits every token window
        (``docs/signals.md``, "Token budgets").

        Raises:
            ThrottleTimeout: the turn did not come within ``max_wait`` (or the
                throttle's ``max_wait``, whichever is shorter).
            ValueError: ``cost`` is no such weight.
        """
        return Acquiring(self._take_turn(key, adjust, max_wait, cost))

    async def _take_turn(
        self,
        key: str,
        adjust: bool,
        max_wait: float | None,
        cost: Cost | Mapping[str, float] | None,
    ) -> Lease:
        """:meth:`acquire`'s wait."""
        tokens = None if cost is None else check_cost(cost)
        if max_wait is not None:  # checked before a turn is taken: none is held on a bad one
            max_wait = check_number("max_wait", max_wait)
        # The maker taken without a call (every request comes here).
        slot = self._table.get_or_create(key)
        turns = self._turns
        make: Maker | None = slot.hold_maker if adjust else None
        if make is None:
            make = turns.maker(slot, adjust)
        lease = slot.gate.grant_now(make, tokens)
        if lease is not None and self._fleet is None:
            return lease  # the turn is now: nothing to wait for or bound
        return await turns.take(slot, make, tokens, lease, max_wait)

    def acquire_now(
        self,
        key: str,
        adjust: bool = True,
        max_wait: float | None = None,
        cost: Cost | Mapping[str, float] | None = None,
    ) -> Lease | None:
        """:meth:`acquire` when the turn is now: the lease at once, or None when
        the request must wait (then ``await acquire(...)``, which queues it).

        The adapters ask this first: a free turn (most turns) is then taken
        without building a coroutine. Unlike :meth:`try_acquire`, a throttle
        whose store is shared (a fleet) answers None rather than raising: its
        turn is only known after a round trip to the store. Arguments as for
        :meth:`acquire`, checked before a turn is taken; they may also be
        given in order (the adapters do: a keyword costs on every request).
        """
        tokens = None if cost is None else check_cost(cost)
        if max_wait is not None:
            check_number("max_wait", max_wait)
        if self._fleet is not None:
            return None
        slot = self._table.get_or_create(key)
        make: Maker | None = slot.hold_maker if adjust else None
        if make is None:
            make = self._turns.maker(slot, adjust)
        return slot.gate.grant_now(make, tokens)

    def acquire_blocking(
        self,
        key: str,
        *,
        adjust: bool = True,
        max_wait: float | None = None,
        cost: Cost | Mapping[str, float] | None = None,
    ) -> Lease:
        """:meth:`acquire` for a thread: block until the turn of slot ``key``.

        For synchronous clients (``autothrottle.httpx.ThrottledClient``
        uses it). Threads and event loops may share one throttle: a slot's
        queue is FIFO across all of them.
        """
        tokens = None if cost is None else check_cost(cost)
        if max_wait is not None:  # checked before a turn is taken: none is held on a bad one
            max_wait = check_number("max_wait", max_wait)
        # The maker taken without a call (every request comes here).
        slot = self._table.get_or_create(key)
        turns = self._turns
        make: Maker | None = slot.hold_maker if adjust else None
        if make is None:
            make = turns.maker(slot, adjust)
        lease = slot.gate.grant_now(make, tokens)
        if lease is not None and self._fleet is None:
            return lease  # the turn is now: nothing to wait for or bound
        return turns.take_blocking(slot, make, tokens, lease, max_wait)

    def try_acquire(
        self, key: str, *, adjust: bool = True, cost: Cost | Mapping[str, float] | None = None
    ) -> Lease | None:
        """A lease for slot ``key`` now if its turn is now, else None; never waits.

        The turn is now when nobody is queued for the slot, it is under its
        concurrency cap, its delay (and any pause or budget) has passed, and
        ``cost`` (as for :meth:`acquire`) fits its token windows.

        Raises:
            TypeError: the throttle's store is shared (a fleet,
                :class:`~autothrottle.redis.RedisStore`): the fleet's turn is
                only known after a round trip to the store, so it cannot be
                taken without waiting; use :meth:`acquire` or
                :meth:`acquire_blocking`.
        """
        if self._fleet is not None:
            raise TypeError(
                "try_acquire cannot take a fleet's turn without waiting for the shared "
                "store; use acquire() or acquire_blocking()"
            )
        tokens = None if cost is None else check_cost(cost)
        slot = self._live(key)
        return slot.gate.grant_now(self._turns.maker(slot, adjust), tokens)

    # -- learning ----------------------------------------------------------------------

    def observe(
        self,
        key: str,
        *,
        latency: float,
        status: int,
        headers: Mapping[str, str] | None = None,
        from_cache: bool | None = None,
    ) -> None:
        """Apply one response to slot ``key``.

        Args:
            key: The slot key.
            latency: Seconds from connection ready to response headers.
            status: The response's HTTP status.
            headers: The response headers, for Retry-After, rate-limit and
                cache signals.
            from_cache: True when a client-side cache answered: a cache hit,
                as if a header had said so. False or None: the headers decide.
        """
        slot = self._live(key)
        reporter = self._rules if self._fleet is None else self._fleet
        reporter.observe(
            slot,
            latency=latency,
            status=status,
            headers=headers,
            adjust=True,
            sent_at=self._last_send(slot),
            from_cache=from_cache,
        )

    def backoff(
        self,
        url_or_key: str,
        *,
        pause: float | None = None,
        sent_at: float | None = None,
        reason: str = "manual",
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
            reason: Why, as the slot's backoff reasons and listeners will
                read it (``"blocked"`` for a soft block, as a
                ``block_classifier`` says it).

        Returns:
            True if the slot backed off, False if the call was taken as the lag
            of an earlier backoff.
        """
        if not isinstance(url_or_key, str) or not url_or_key:
            raise TypeError(f"url_or_key must be a non-empty str, got {url_or_key!r}")
        if not isinstance(reason, str) or not reason:
            raise TypeError(f"reason must be a non-empty str, got {reason!r}")
        key = self.key_for(url_or_key) if "://" in url_or_key else url_or_key
        slot = self._live(key)
        now = self._clock()
        if pause is not None:
            self._rules.pause(slot, check_number("pause", pause), now, reason="manual pause")
        if sent_at is not None:
            sent_at = check_number("sent_at", sent_at, minimum=-math.inf)
        else:
            sent_at = self._last_send(slot)
        backed_off = self._rules.backoff(slot, reason, sent_at, now)
        if self._fleet is not None:
            self._fleet.report(slot, sent_at, backed_off=backed_off)
        return backed_off

    @staticmethod
    def _last_send(slot: LiveSlot) -> float:
        """Without a lease the send time is unknown: take the slot's latest send,
        so a repeated signal with nothing sent in between counts once."""
        last = slot.gate.last_send
        return last if last is not None else -math.inf


def keys_by_host(throttle: Throttle) -> bool:
    """Whether ``throttle`` keys a URL by its host alone: it was given no key
    function (fixed when it was made). Its :meth:`~Throttle.key_for` of a URL
    whose host is known is then ``host_key(host)``, which an adapter may ask
    itself, a call fewer on every request
    (``test_the_middleware_keys_a_request_as_the_throttle_does``)."""
    return throttle._key is None  # noqa: SLF001 (this module's own class)


class Acquiring(Coroutine[Any, Any, Lease]):
    """What :meth:`Throttle.acquire` returns: a coroutine of the lease, which is
    also an async context manager holding the lease for its block.

    Name it in an annotation (``turn: Acquiring = throttle.acquire(key)``).
    Entering awaits the same wait as awaiting does, so a cancelled wait leaves
    nothing behind either way; between the lease's grant and the block there is
    no suspension point, and leaving the block releases it, however it is left.
    A coroutine (not merely awaitable) so that ``asyncio.create_task`` and
    anyio's task groups still take what ``acquire`` returns.

    A subclass of :class:`Throttle` that wraps :meth:`~Throttle.acquire` returns
    one too, made from its own coroutine of the lease, so that its callers may
    still enter it (an ``async def acquire`` would return a plain coroutine,
    which ``async with`` refuses, and type checkers flag the override)::

        class Counted(Throttle):
            waits = 0

            def acquire(self, key: str, **kwargs: Any) -> Acquiring:
                return Acquiring(self._counted(super().acquire(key, **kwargs)))

            async def _counted(self, turn: Acquiring) -> Lease:
                self.waits += 1
                return await turn

    Args:
        turn: The coroutine whose result is the lease.
    """

    __slots__ = ("_lease", "_turn")

    def __init__(self, turn: Coroutine[Any, Any, Lease]) -> None:
        if type(turn) is not CoroutineType and not isinstance(turn, Coroutine):
            raise TypeError(f"turn must be a coroutine of a Lease, got {turn!r}")
        self._turn = turn
        self._lease: Lease | None = None

    def __await__(self) -> Generator[Any, None, Lease]:
        return self._turn.__await__()

    def send(self, value: Any) -> Any:
        return self._turn.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:
            return self._turn.throw(typ)
        return self._turn.throw(typ, val, tb)

    def close(self) -> None:
        self._turn.close()

    async def __aenter__(self) -> Lease:
        lease = self._lease = await self._turn
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()


def check_throttle(value: object, where: str) -> Throttle:
    """``value`` if it is a throttle; else the TypeError every adapter raises
    (``where`` names the adapter), naming the value, and for the class itself
    asking for an instance."""
    if isinstance(value, Throttle):
        return value
    if isinstance(value, type) and issubclass(value, Throttle):
        raise TypeError(
            f"{where}: throttle must be an autothrottle.Throttle, got the class "
            f"{value.__name__}; pass an instance: throttle={value.__name__}()"
        )
    raise TypeError(f"{where}: throttle must be an autothrottle.Throttle, got {value!r}")


def missing_throttle(where: str, args: tuple[object, ...], first: str | None) -> str:
    """The message of an adapter built without ``throttle=``: what it takes and
    how to pass it; a throttle given positionally landed in ``first`` (the
    adapter's first parameter, if it has one)."""
    message = (
        f"{where} needs throttle=, an autothrottle.Throttle (keyword only), e.g. "
        f"{where}(throttle=Throttle())"
    )
    if any(isinstance(arg, Throttle) for arg in args):
        message += "; the Throttle was passed positionally"
        if first is not None:
            message += f", where {first} goes"
    return message


def throttle_hint(cls: type, args: tuple[object, ...], kwargs: dict[str, object]) -> str | None:
    """The hint (see :func:`~autothrottle._validate.keywords_only`) of an adapter
    class taking ``throttle=``: the message when it is missing, else None."""
    if "throttle" in kwargs:
        return None
    positional = [
        parameter.name
        for parameter in inspect.signature(cls).parameters.values()
        if parameter.kind is parameter.POSITIONAL_OR_KEYWORD
    ]
    return missing_throttle(cls.__name__, args, positional[0] if positional else None)
