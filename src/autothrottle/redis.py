"""A store shared through Redis: a fleet of processes paces each host as one.

::

    from autothrottle import Throttle
    from autothrottle.redis import RedisStore

    throttle = Throttle(store=RedisStore("redis://10.0.0.5:6379/0", prefix="crawl-42"))

Every process that uses the same Redis and ``prefix`` shares, per slot, the
next free send time, the delay the fleet learned, the pause, the pace the
host stated to any of them, the leases in flight and the last learned
record, which outlives the crawl for ``ttl`` seconds so a restarted fleet
starts where it left off. The rules (how a turn is taken, what is adopted,
how changes merge, what happens when Redis fails) are
:mod:`autothrottle._fleet`'s; the Lua scripts run them on the server.

Cost: a turn is one script on Redis. Everything a process has to say goes in
one pipeline: the turns asked for at the same moment (of any slots), the
finished leases and what responses taught, so a request costs at most one
round trip, and less when requests come together (``docs/fleet.md``;
:mod:`autothrottle._redis_send` sends, :mod:`autothrottle._redis_outage` paces
alone while Redis does not answer, :mod:`autothrottle._redis_runs` serves
requests from the turns reserved ahead and lines them up behind a slot's ask,
:mod:`autothrottle._redis_listen` hears the pauses the other processes set).

Failure: when Redis is unreachable or slow (``timeout``), the process logs one
warning and paces on its own, from what it learned last, trying Redis again
every ``retry_after`` seconds; no request fails or hangs because of the store.
With ``fail_closed=True`` requests wait for Redis instead, bounded by the
throttle's ``max_wait``. A key of the wrong type under the prefix sends only
its own slot alone, and is logged as a data error.

Requires the ``redis`` extra. Async clients use redis-py's asyncio client,
sync clients (``Throttle.acquire_blocking``) its sync client: pass a URL for
both, or the client of the kind you use (a ``RedisCluster`` too).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, Self

try:
    import redis as _needed  # noqa: F401  (the extra this module needs)
except ImportError as _missing:  # pragma: no cover - depends on the environment
    from ._extras import missing_extra_error

    raise missing_extra_error("autothrottle.redis", "redis", "redis") from _missing

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.cluster
from redis.exceptions import ResponseError

from ._fleet import Run, SharedTurn, TurnAsk, slack
from ._redis_listen import Listener
from ._redis_outage import Outage
from ._redis_parts import (
    ASK_AGAIN,
    DOWN,
    FREE_TO_LINGER,
    LINGER,
    LINGER_MOST,
    Ask,
    AsyncClient,
    Change,
    SyncClient,
    as_text,
    keys,
    phase,
    run_leases,
    us,
)
from ._redis_runs import Runs
from ._redis_send import Sender
from ._state import SlotState
from ._store import MemoryStore
from ._validate import check_bool, check_number, check_positive

__all__ = ["RedisStore"]

_P = ParamSpec("_P")


class RedisStore:
    """Slot state shared by every process using the same Redis and ``prefix``.

    Close it before the event loop ends, ``async with RedisStore(...) as store:``
    or :meth:`aclose` (a thread's :meth:`close`): it hands back what this
    process reserved and did not use, and ends the subscriber it keeps from its
    first answered turn on (one more connection, a task or a thread) to hear
    the pauses other processes set (``docs/fleet.md``, "Deploying"). A store
    dropped unclosed ends that subscriber once it is collected (the subscriber
    holds it only weakly), but what it reserved waits in Redis until its
    leases expire, and its own connections until the garbage collector.

    Args:
        url_or_client: A ``redis://`` URL (async and sync clients are made
            from it), or a redis-py client: ``redis.asyncio.Redis`` or
            ``RedisCluster`` (for async throttles; its event loop must be the
            one the throttle runs on), or ``redis.Redis`` or ``RedisCluster``
            (for ``acquire_blocking``).
        prefix: Names the crawl: throttles with different prefixes share nothing.
        ttl: Seconds a slot's shared state outlives its last use (default a day).
        idle_timeout: Seconds an idle slot stays in this process (as
            :class:`~autothrottle.store.MemoryStore`).
        timeout: Seconds a Redis call may take before the process paces alone.
        retry_after: Seconds between tries while Redis is down.
        fail_closed: Wait for Redis instead of pacing alone while it is down.

    Raises:
        TypeError, ValueError: a bad argument, named.
    """

    def __init__(
        self,
        url_or_client: str | AsyncClient | SyncClient,
        *,
        prefix: str,
        ttl: float = 86_400.0,
        idle_timeout: float = 600.0,
        timeout: float = 0.25,
        retry_after: float = 5.0,
        fail_closed: bool = False,
    ) -> None:
        url: str | None = None
        async_client: AsyncClient | None = None
        sync_client: SyncClient | None = None
        if isinstance(url_or_client, str):
            url = url_or_client
        elif isinstance(url_or_client, aioredis.Redis | aiocluster.RedisCluster):
            async_client = url_or_client
        elif isinstance(url_or_client, redis.Redis | redis.cluster.RedisCluster):
            sync_client = url_or_client
        else:
            raise TypeError(
                f"url_or_client must be a redis:// URL or a redis-py client, got {url_or_client!r}"
            )
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a non-empty str without braces, got {prefix!r}")
        self.prefix = prefix
        self.ttl = check_positive("ttl", ttl)
        self.timeout = check_positive("timeout", timeout)
        self.retry_after = check_number("retry_after", retry_after)
        self.fail_closed = check_bool("fail_closed", fail_closed)
        self._local = MemoryStore(idle_timeout)
        self._outage = Outage(prefix, self.retry_after, self.fail_closed)
        self._process = uuid.uuid4().hex
        self._send = Sender(
            self._outage,
            prefix=prefix,
            process=self._process,
            url=url,
            async_client=async_client,
            sync_client=sync_client,
            ttl=self.ttl,
            timeout=self.timeout,
        )
        self._runs = Runs(self._send.unused)
        # The subscriber holds the store's runs only weakly: a store dropped
        # unclosed is collected, and its subscriber then ends (its task
        # cancelled, its connection closed) instead of pending until the loop
        # is torn down.
        self._listener = Listener(self._send, _weakly(self._runs.heard), _weakly(self._runs.stated))
        weakref.finalize(self, self._listener.dropped).atexit = False

    @property
    def turns(self) -> int:
        """Turns taken through the fleet so far (asked of Redis, or of a run)."""
        return self._runs.turns

    @property
    def round_trips(self) -> int:
        """Round trips to Redis so far (each pipeline sent is one)."""
        return self._send.round_trips

    # -- the SlotStore protocol: this process's records -----------------------------

    @property
    def idle_timeout(self) -> float:
        """Seconds an idle slot stays in this process."""
        return self._local.idle_timeout

    def load(self, key: str) -> SlotState | None:
        return self._local.load(key)

    def save(self, key: str, state: SlotState) -> None:
        self._local.save(key, state)

    def discard(self, key: str) -> None:
        """Forget the slot here (what the fleet shares stays in Redis for ``ttl``)."""
        self._local.discard(key)
        self._outage.forget(key)
        self._runs.forget(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._local)

    def __len__(self) -> int:
        return len(self._local)

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self.prefix!r}, slots={len(self._local)})"

    # -- the SharedTurns protocol: the fleet (autothrottle._fleet's rules) ----------------

    async def take_turn(
        self, key: str, ask: TurnAsk, now: float, left: float = math.inf
    ) -> SharedTurn:
        """Reserve the slot's next send across the fleet (at most one round trip;
        none for a turn of a run already reserved, or for a request served
        behind another of this process that asked for the slot: it waits for
        that answer, at most ``left`` seconds)."""
        return await self._runs.take_turn(key, ask, now, left, self._asked)

    async def _asked(
        self, key: str, ask: TurnAsk, now: float, ready: tuple[int, float], run: Run
    ) -> SharedTurn:
        """The slot's one ask of this process: a run of ``ready[0]`` turns, with
        room ``ready[1]`` after it."""
        alone = self._outage.alone_now(key, ask, now)
        if alone is not None:
            return alone
        loop = asyncio.get_running_loop()
        request = self._ask(key, ask, now, loop.create_future(), ready)
        self._send.turn(request, loop)
        try:
            reply = await request.done
        except ResponseError as error:
            return self._outage.data_error(key, ask, error, now)
        if reply is DOWN:
            return self._outage.while_down(key, ask, now)
        return self._answer(key, ask, reply, now, ready[1], run)

    def take_turn_blocking(
        self, key: str, ask: TurnAsk, now: float, left: float = math.inf
    ) -> SharedTurn:
        """:meth:`take_turn` for a thread (``Throttle.acquire_blocking``)."""
        return self._runs.take_turn_blocking(key, ask, now, left, self._asked_blocking)

    def _asked_blocking(
        self, key: str, ask: TurnAsk, now: float, ready: tuple[int, float], run: Run
    ) -> SharedTurn:
        alone = self._outage.alone_now(key, ask, now)
        if alone is not None:
            return alone
        request = self._ask(key, ask, now, threading.Event(), ready)
        self._send.turn_blocking(request)
        reply = request.reply
        if reply is DOWN:
            return self._outage.while_down(key, ask, now)
        if isinstance(reply, ResponseError):
            return self._outage.data_error(key, ask, reply, now)
        assert isinstance(reply, list)
        return self._answer(key, ask, reply, now, ready[1], run)

    async def look(self, key: str, lease: str, ask: TurnAsk, now: float) -> SharedTurn:
        """Whether the turn ``lease``, reached late a second time, may go now: no
        pause, under the cap (one round trip; nothing is reserved)."""
        if self._outage.alone_now(key, ask, now) is not None:
            return self._unlooked(lease)
        loop = asyncio.get_running_loop()
        args = self._look_args(key, lease, ask, now)
        request = Ask(key, args, lease, loop.create_future(), "look")
        self._send.turn(request, loop)
        try:
            reply = await request.done
        except ResponseError as error:
            self._outage.data_error(key, ask, error, now)
            return self._unlooked(lease)
        if reply is DOWN:
            return self._unlooked(lease)
        return self._looked(key, ask, lease, reply, now)

    def look_blocking(self, key: str, lease: str, ask: TurnAsk, now: float) -> SharedTurn:
        """:meth:`look` for a thread."""
        if self._outage.alone_now(key, ask, now) is not None:
            return self._unlooked(lease)
        request = Ask(key, self._look_args(key, lease, ask, now), lease, threading.Event(), "look")
        self._send.turn_blocking(request)
        reply = request.reply
        if isinstance(reply, ResponseError):
            self._outage.data_error(key, ask, reply, now)
            return self._unlooked(lease)
        if reply is DOWN:
            return self._unlooked(lease)
        assert isinstance(reply, list)
        return self._looked(key, ask, lease, reply, now)

    def changed(
        self,
        key: str,
        state: SlotState,
        now: float,
        *,
        sent_at: float,
        backed_off: bool,
        ok: bool = False,
        strict: bool = False,
        began: bool = False,
    ) -> None:
        """Share the slot's record soon (coalesced per slot, with the next message)."""
        change = Change(state, now, sent_at, backed_off, int(ok), strict, began)
        self._send.changed(key, change)

    def released(self, key: str, lease: str) -> None:
        """Hand a finished request's shared lease back (with the next message):
        within :data:`LINGER` when the slot was near the fleet's cap at its last
        turn (another process may be waiting for the lease), else within a
        quarter of the slot's gap, at most :data:`LINGER_MOST` (the fleet's
        count of its leases runs that much behind, far from its cap)."""
        run = self._runs.get(key)
        linger = LINGER
        if run is not None and run.free >= FREE_TO_LINGER:
            linger = min(max(run.spacing / 4.0, LINGER), LINGER_MOST)
        self._send.released(key, lease, linger)

    def idle(self, key: str) -> None:
        """No request of this process is left for the slot: hand back its run's rest."""
        self._runs.idle(key)

    def late(self, key: str, lease: str) -> None:
        """A turn reached after its slack is not sent: it goes back with the next
        message, its time too when it was the latest reserved (rule 1)."""
        self._runs.late(key, lease)

    def fleet_pause(self, key: str, max_pause: float, now: float) -> float:
        """Seconds (at most ``max_pause``) of a pause of the slot another process
        set since this one's last answer for it, as heard on the prefix's
        channel (rule 2; 0.0: none heard). Told once: the asker adopts it
        (rule 4), and the next turn names it as waited out."""
        heard = self._runs.told(key)
        if heard is None:
            return 0.0
        until, end = heard
        left = min(until - time.monotonic(), max_pause)
        if left <= 0.0:
            return 0.0
        self._outage.waits(key, end, now + left)
        return left

    def fleet_stated(self, key: str) -> float:
        """Seconds of the gap another process heard the slot's host state, as
        heard on the prefix's channel, that a send now keeps (rule 8; 0.0:
        none heard, or it ended)."""
        return self._runs.stated_gap(key)

    async def flush(self) -> None:
        """Send what is waiting (learned records, finished leases) now, if Redis answers."""
        await self._send.flush()

    def flush_blocking(self) -> None:
        """:meth:`flush` for a thread."""
        self._send.flush_blocking()

    async def aclose(self) -> None:
        """Hand back the turns reserved and not taken, flush, then close the Redis
        clients. Call it (or use ``async with``) before the event loop ends:
        without it the last finished leases wait for their lease's expiry in
        Redis, and a send still lingering is cut off with the loop."""
        await self._listener.aclose()
        self._runs.drop()
        await self.flush()
        if self._send.async_client is not None:
            await self._send.async_client.aclose()
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def close(self) -> None:
        """Stop hearing the fleet's pauses, flush what the sync client has to send,
        stop its sender, close the sync client."""
        self._listener.close()
        self._runs.drop()
        self._send.close()

    async def shared_record(self, key: str) -> dict[str, Any] | None:
        """The fleet's last shared record of slot ``key`` (``SlotState.to_dict`` data)."""
        raw = await self._send.async_redis().hget(keys(self.prefix, key)[0], "record")
        return None if raw is None else dict(json.loads(as_text(raw)))

    # -- a turn's question and answer --------------------------------------------------

    def _ask(self, key: str, ask: TurnAsk, now: float, done: Any, run: tuple[int, float]) -> Ask:
        lease = uuid.uuid4().hex
        hold = ask.hold if math.isfinite(ask.hold) else 3_600.0
        max_pause = ask.max_pause if math.isfinite(ask.max_pause) else 1e9
        args: list[str | int] = [
            us(ask.gap),
            us(ask.min_gap),
            us(ask.max_gap if math.isfinite(ask.max_gap) else 1e9),
            ask.cap,
            us(hold),
            lease,
            round(self.ttl * 1000),
            self._process,
            us(max_pause),
            self._outage.paused(key, now),
            f"{ask.margin:.6f}",
            us(ask.late),
            f"{phase(key):.6f}",
            run[0],
            us(run[1]),
        ]
        return Ask(key, args, lease, done, turns=run[0])

    def _look_args(self, key: str, lease: str, ask: TurnAsk, now: float) -> list[str | int]:
        hold = ask.hold if math.isfinite(ask.hold) else 3_600.0
        max_pause = ask.max_pause if math.isfinite(ask.max_pause) else 1e9
        paused = self._outage.paused(key, now)
        return [lease, us(hold), ask.cap, round(self.ttl * 1000), us(max_pause), paused]

    def _unlooked(self, lease: str) -> SharedTurn:
        """Redis did not answer a look: the turn goes, as the process goes alone
        (rule 6); with ``fail_closed`` it waits for Redis instead."""
        outage = self._outage
        if outage.fail_closed and outage.down():
            return SharedTurn(max(outage.down_until - time.monotonic(), 0.05), None, None, 0.0)
        return SharedTurn(0.0, lease, None, 0.0)

    def _looked(
        self, key: str, ask: TurnAsk, lease: str, reply: list[Any], now: float
    ) -> SharedTurn:
        """The look's answer: go on ``lease``, or (a pause, the cap) wait, as a turn's."""
        parts = [as_text(p) for p in reply[:7]]
        if not parts[1]:
            return self._later(key, ask, reply, now)
        delay = parts[2]
        shared = float(delay) / 1e6 if delay else None
        return SharedTurn(0.0, lease, shared, 0.0, None, int(parts[4]))

    def _later(self, key: str, ask: TurnAsk, reply: list[Any], now: float) -> SharedTurn:
        """Not a turn but "ask again then" (a pause, the cap): never a wait of 0,
        which would mean "go alone"."""
        waited, _, delay, pause, processes, paused, server = (as_text(p) for p in reply[:7])
        received = time.monotonic()
        wait = self._send.server_clock.wait(float(server) / 1e6, float(waited) / 1e6, received)
        wait = max(wait, ASK_AGAIN)
        shared = float(delay) / 1e6 if delay else None
        gap = min(max(shared if shared is not None else ask.gap, ask.min_gap), ask.max_gap)
        senders = int(processes)
        if len(reply) < 12:  # a look's: it says no gap; the last turn's answer did
            self._outage.shared(key, None, senders, paused, now + wait)
        else:
            share, stated = _shares(reply, gap * ask.margin, now)
            self._outage.shared(key, share, senders, paused, now + wait, stated)
        if float(pause) > 0:  # rule 2: the turns reserved before a pause are void
            self._runs.void(key)
        return SharedTurn(wait, None, shared, float(pause) / 1e6, None, senders)

    def _answer(
        self, key: str, ask: TurnAsk, reply: list[Any], now: float, room: float, run: Run
    ) -> SharedTurn:
        self._runs.answered()
        parts = [as_text(p) for p in reply[:7]]
        if not parts[1]:
            return self._later(key, ask, reply, now)
        waited, lease, delay, pause, processes, paused, server = parts
        received = time.monotonic()
        wait = self._send.server_clock.wait(float(server) / 1e6, float(waited) / 1e6, received)
        shared = float(delay) / 1e6 if delay else None
        gap = min(max(shared if shared is not None else ask.gap, ask.min_gap), ask.max_gap)
        senders = int(processes)
        turns = int(as_text(reply[7])) if len(reply) > 7 else 1
        spacing = float(as_text(reply[8])) / 1e6 if len(reply) > 8 else 0.0
        # The gap Redis reserved with (a pace the host stated to another process
        # included, rule 1) is the share this process keeps alone (rule 6).
        share, stated = _shares(reply, spacing or gap * ask.margin, now)
        self._outage.shared(key, share, senders, paused, now + wait, stated)
        due = received + wait
        free = int(as_text(reply[9])) if len(reply) > 9 else 0
        dues = [due + i * spacing for i in range(turns)]
        leases = run_leases(lease, turns)
        after = slack(spacing or gap * ask.margin, ask.margin, ask.late, turns, room)
        self._runs.reserved(
            key,
            run,
            dues,
            leases,
            spacing=spacing,
            delay=shared,
            senders=senders,
            slack=after,
            free=free,
            at=float(server),
            asked=now,
        )
        self._listener.start()  # rule 2: from now on, hear the pauses others set
        return SharedTurn(
            wait,
            lease,
            shared,
            float(pause) / 1e6,
            due,
            senders,
            closes=turns == 1,
            slack=after if turns == 1 else math.inf,
            asked=now,
        )


def _shares(reply: list[Any], gap: float, now: float) -> tuple[float, tuple[float, float]]:
    """The gap a turn's answer says the fleet keeps (``gap`` when it says none: a
    look's), and the gap without the pace a host stated with when that pace ends
    (on the throttle's clock, from ``now``; ``(0.0, inf)``: none holds): what a
    process keeps alone (rule 6), back to the fleet's own pace when the host's
    ends, as the fleet is (rule 1)."""
    if len(reply) < 12:
        return gap, (0.0, math.inf)
    gap = float(as_text(reply[8])) / 1e6 or gap
    left = float(as_text(reply[11])) / 1e6
    if left <= 0.0:
        return gap, (0.0, math.inf)
    return gap, (float(as_text(reply[10])) / 1e6, now + left)


def _weakly(method: Callable[_P, None]) -> Callable[_P, None]:
    """``method`` of an object, called while the object lives (then a no-op)."""
    ref = weakref.WeakMethod(method)

    def call(*args: _P.args, **kwargs: _P.kwargs) -> None:
        live = ref()
        if live is not None:
            live(*args, **kwargs)

    return call
