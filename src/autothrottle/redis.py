"""A store shared through Redis: a fleet of processes paces each host as one.

::

    from autothrottle import Throttle
    from autothrottle.redis import RedisStore

    throttle = Throttle(store=RedisStore("redis://10.0.0.5:6379/0", prefix="crawl-42"))

Every process that uses the same Redis and ``prefix`` shares, per slot: the
next free send time (so N processes keep the pace one would), the delay the
fleet learned (a backoff seen by one slows all of them, and is never undone
by a concurrent latency update), the pause (Retry-After, a spent budget), the
leases in flight (each with an expiry, so a crashed worker's share comes
back) and the last learned record, which outlives the crawl for ``ttl``
seconds so a restarted fleet starts where it left off. What stays in each
process: its queue, its own leases, the jitter, and everything else of the
engine (``docs/fleet.md``).

Cost: taking a turn is one Lua script on Redis (one round trip, on the
server's clock); what a response taught is merged by another script in one
pipelined round trip, in the background, together with finished leases.

Failure: when Redis is unreachable or slow (``timeout``), the process logs one
warning and paces on its own, from what it learned last, trying Redis again
every ``retry_after`` seconds; no request fails or hangs because of the store.
With ``fail_closed=True`` requests wait for Redis instead (bounded by the
throttle's ``max_wait``): for users who must never exceed a shared limit.

Requires the ``redis`` extra (redis-py's asyncio client). Async clients only:
the sync httpx client paces on its own process's state.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ._redis_lua import MERGE, TURN
from ._state import SlotState
from ._store import MemoryStore, SharedTurn
from ._validate import check_bool, check_number, check_positive

__all__ = ["RedisStore"]

logger = logging.getLogger("autothrottle")

_LOCAL = SharedTurn(0.0, None, None, 0.0)
"""Go on local pacing alone (Redis is down)."""

_PROTECT = 2.0
"""Seconds after a backoff in which no process may lower the fleet's delay."""


class RedisStore:
    """Slot state shared by every process using the same Redis and ``prefix``.

    Args:
        url_or_client: A ``redis://`` URL, or a ``redis.asyncio.Redis`` client
            (its event loop must be the one the throttle runs on).
        prefix: Names the crawl: throttles with different prefixes share nothing.
        ttl: Seconds a slot's shared state outlives its last use (default a day).
        idle_timeout: Seconds an idle slot stays in this process (as
            :class:`~autothrottle.MemoryStore`).
        timeout: Seconds a Redis call may take before the process paces alone.
        retry_after: Seconds between tries while Redis is down.
        fail_closed: Wait for Redis instead of pacing alone while it is down.

    Raises:
        TypeError, ValueError: a bad argument, named.
    """

    def __init__(
        self,
        url_or_client: str | aioredis.Redis,
        *,
        prefix: str,
        ttl: float = 86_400.0,
        idle_timeout: float = 600.0,
        timeout: float = 0.25,
        retry_after: float = 5.0,
        fail_closed: bool = False,
    ) -> None:
        if isinstance(url_or_client, str):
            self._client = aioredis.Redis.from_url(url_or_client)
        elif isinstance(url_or_client, aioredis.Redis):
            self._client = url_or_client
        else:
            raise TypeError(
                f"url_or_client must be a redis:// URL or a redis.asyncio.Redis, "
                f"got {url_or_client!r}"
            )
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must be a non-empty str without braces, got {prefix!r}")
        self.prefix = prefix
        self.ttl = check_positive("ttl", ttl)
        self.timeout = check_positive("timeout", timeout)
        self.retry_after = check_number("retry_after", retry_after)
        self.fail_closed = check_bool("fail_closed", fail_closed)
        self._local = MemoryStore(idle_timeout)
        self._turn = self._client.register_script(TURN)
        self._merge = self._client.register_script(MERGE)
        self._dirty: dict[str, tuple[SlotState, bool]] = {}
        self._released: list[tuple[str, str]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._down_until = -math.inf
        self._warned = False
        self._process = uuid.uuid4().hex
        self._alone_gap: dict[str, float] = {}
        self._alone_next: dict[str, float] = {}
        self.round_trips = 0
        """Round trips to Redis so far (turns taken and pipelines flushed)."""

    # -- the SlotStore protocol: this process's records -----------------------------

    @property
    def idle_timeout(self) -> float:
        """Seconds an idle slot stays in this process."""
        return self._local.idle_timeout

    def load(self, key: str) -> SlotState | None:
        return self._local.load(key)

    def save(self, key: str, state: SlotState) -> None:
        self._local.save(key, state)

    def update(self, key: str, change: Callable[[SlotState], None]) -> SlotState | None:
        return self._local.update(key, change)

    def discard(self, key: str) -> None:
        self._local.discard(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._local)

    def __len__(self) -> int:
        return len(self._local)

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self.prefix!r}, slots={len(self._local)})"

    # -- the SharedTurns protocol: the fleet -------------------------------------------

    def _keys(self, key: str) -> tuple[str, str, str]:
        tag = f"{{{self.prefix}:{key}}}"
        return f"{tag}:s", f"{tag}:l", f"{tag}:p"

    async def take_turn(self, key: str, *, gap: float, cap: int, hold: float) -> SharedTurn:
        """Reserve the slot's next send across the fleet (one round trip)."""
        if time.monotonic() < self._down_until:
            return self._while_down(key)
        lease = uuid.uuid4().hex
        hold_us = hold * 1e6 if math.isfinite(hold) else 3_600e6
        args: list[str | int] = [
            round(gap * 1e6),
            cap,
            round(hold_us),
            lease,
            round(self.ttl * 1000),
            self._process,
        ]
        call = self._turn(keys=self._keys(key), args=args)
        self.round_trips += 1
        try:
            reply = await asyncio.wait_for(call, self.timeout)
        except (TimeoutError, RedisError, OSError) as error:
            return self._went_down(error, key)
        self._came_back()
        wait, granted, delay, paused, processes = (_text(part) for part in reply)
        # Alone, this process keeps the fleet's pace divided among its processes.
        self._alone_gap[key] = (float(delay) / 1e6 if delay else gap) * max(1, int(processes))
        return SharedTurn(
            float(wait) / 1e6,
            granted or None,
            float(delay) / 1e6 if delay else None,
            float(paused) / 1e6,
        )

    def changed(self, key: str, state: SlotState, *, backed_off: bool) -> None:
        """Share the slot's record soon (coalesced, pipelined, in the background)."""
        previous = self._dirty.get(key)
        self._dirty[key] = (state, backed_off or (previous is not None and previous[1]))
        self._flush_soon()

    def released(self, key: str, lease: str) -> None:
        """Hand a finished request's shared lease back (with the next flush)."""
        self._released.append((key, lease))
        self._flush_soon()

    async def flush(self) -> None:
        """Send what is waiting (learned records, finished leases) now."""
        dirty, self._dirty = self._dirty, {}
        released, self._released = self._released, []
        if not dirty and not released:
            return
        if time.monotonic() < self._down_until:
            return  # what the fleet missed is resent with the slot's next change
        try:
            await asyncio.wait_for(self._send(dirty, released), self.timeout * 4)
        except (TimeoutError, RedisError, OSError) as error:
            self._went_down(error, None)
        else:
            self._came_back()

    async def aclose(self) -> None:
        """Flush, then close the Redis client."""
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)
        await self.flush()
        await self._client.aclose()

    async def shared_record(self, key: str) -> dict[str, Any] | None:
        """The fleet's last shared record of slot ``key`` (``SlotState.to_dict`` data)."""
        raw = await self._client.hget(self._keys(key)[0], "record")
        return None if raw is None else dict(json.loads(_text(raw)))

    # -- inside the store -----------------------------------------------------------

    async def _send(
        self, dirty: dict[str, tuple[SlotState, bool]], released: list[tuple[str, str]]
    ) -> None:
        now = time.monotonic()
        pipe = self._client.pipeline(transaction=False)
        for key, lease in released:
            pipe.zrem(self._keys(key)[1], lease)
        for key, (state, backed_off) in dirty.items():
            pause = max(0.0, state.pause_until - now) if math.isfinite(state.pause_until) else 0.0
            args: list[str | int] = [
                round(state.delay * 1e6),
                "1" if backed_off else "0",
                round(pause * 1e6),
                json.dumps(state.to_dict(now)),
                round(self.ttl * 1000),
                round(_PROTECT * 1e6),
            ]
            await self._merge(keys=[self._keys(key)[0]], args=args, client=pipe)
        self.round_trips += 1
        await pipe.execute()

    def _flush_soon(self) -> None:
        if self._flushing is not None and not self._flushing.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # a thread with no loop: its changes go with the next flush
        self._flushing = loop.create_task(self.flush())

    def _went_down(self, error: BaseException, key: str | None) -> SharedTurn:
        self._down_until = time.monotonic() + self.retry_after
        if not self._warned:
            self._warned = True
            how = "waiting for it" if self.fail_closed else "pacing on this process's own state"
            logger.warning(
                "autothrottle: Redis store %r unreachable (%s: %s); %s, retrying every %gs",
                self.prefix,
                type(error).__name__,
                error,
                how,
                self.retry_after,
            )
        return self._while_down(key)

    def _while_down(self, key: str | None) -> SharedTurn:
        """Alone: wait for Redis (fail closed), or keep this process's share of
        the fleet's last pace (its delay times the processes last seen)."""
        now = time.monotonic()
        if self.fail_closed:
            return SharedTurn(max(self._down_until - now, 0.05), None, None, 0.0)
        if key is None:
            return _LOCAL
        at = self._alone_next.get(key, now)
        if at > now:
            return SharedTurn(at - now, None, None, 0.0)  # asks again then, and goes
        self._alone_next[key] = now + self._alone_gap.get(key, 0.0)
        return _LOCAL

    def _came_back(self) -> None:
        if self._warned:
            self._warned = False
            logger.warning("autothrottle: Redis store %r reachable again; sharing", self.prefix)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
