"""A store shared through Redis: a fleet of processes paces each host as one.

::

    from autothrottle import Throttle
    from autothrottle.redis import RedisStore

    throttle = Throttle(store=RedisStore("redis://10.0.0.5:6379/0", prefix="crawl-42"))

Every process that uses the same Redis and ``prefix`` shares, per slot, the
next free send time, the delay the fleet learned, the pause, the leases in
flight and the last learned record, which outlives the crawl for ``ttl``
seconds so a restarted fleet starts where it left off. The rules (how a turn
is taken, what is adopted, how changes merge, what happens when Redis fails)
are :mod:`autothrottle._fleet`'s; the Lua scripts run them on the server.

Cost: a turn is one script on Redis. Everything a process has to say goes in
one pipeline: the turns asked for at the same moment (of any slots), the
finished leases and what responses taught, so a request costs at most one
round trip, and less when requests come together (``docs/fleet.md``).

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
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

try:
    import redis as _needed  # noqa: F401  (the extra this module needs)
except ImportError as _missing:  # pragma: no cover - depends on the environment
    from ._extras import missing_extra_error

    raise missing_extra_error("autothrottle.redis", "redis", "redis") from _missing

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.cluster
from redis.exceptions import NoScriptError, RedisError, ResponseError

from ._fleet import SharedTurn, TurnAsk
from ._redis_lua import MERGE, TURN
from ._redis_parts import (
    ALONE,
    ASK_AGAIN,
    CALIBRATE,
    DOWN,
    FIRST,
    LINGER,
    MAX_PENDING,
    Alone,
    Ask,
    AsyncClient,
    Change,
    ServerClock,
    SyncClient,
    as_text,
    deliver,
    phase,
    sha,
    us,
    within,
)
from ._state import SlotState
from ._store import MemoryStore
from ._validate import check_bool, check_number, check_positive

__all__ = ["RedisStore"]

logger = logging.getLogger("autothrottle")


class RedisStore:
    """Slot state shared by every process using the same Redis and ``prefix``.

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
        self._url: str | None = None
        self._async: AsyncClient | None = None
        self._sync: SyncClient | None = None
        if isinstance(url_or_client, str):
            self._url = url_or_client
        elif isinstance(url_or_client, aioredis.Redis | aiocluster.RedisCluster):
            self._async = url_or_client
        elif isinstance(url_or_client, redis.Redis | redis.cluster.RedisCluster):
            self._sync = url_or_client
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
        self._scripts = {
            name: (text, sha(text)) for name, text in (("turn", TURN), ("merge", MERGE))
        }
        self._lock = threading.Lock()
        self._turns: list[Ask] = []
        self._sync_turns: list[Ask] = []
        self._releases: list[tuple[str, str]] = []
        self._changes: dict[str, Change] = {}
        self._alone: dict[str, Alone] = {}
        self._sender: asyncio.Task[None] | None = None
        self._lingering: asyncio.TimerHandle | None = None
        self._sync_sender = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._wake_flusher = threading.Condition(self._lock)
        self._closed = False
        self._ready_async = self._ready_sync = False
        self._server_clock = ServerClock()
        self._processes = 1  # the most processes seen sharing a slot
        self._down_until = -math.inf
        self._warned = False
        self._process = uuid.uuid4().hex
        self.round_trips = 0
        """Round trips to Redis so far (each pipeline sent is one)."""
        self.turns = 0
        """Turns asked of Redis so far."""

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
        with self._lock:
            self._alone.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._local)

    def __len__(self) -> int:
        return len(self._local)

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self.prefix!r}, slots={len(self._local)})"

    # -- the SharedTurns protocol: the fleet (autothrottle._fleet's rules) ----------------

    async def take_turn(self, key: str, ask: TurnAsk, now: float) -> SharedTurn:
        """Reserve the slot's next send across the fleet (at most one round trip)."""
        alone = self._alone_now(key, ask, now)
        if alone is not None:
            return alone
        loop = asyncio.get_running_loop()
        request = self._ask(key, ask, now, loop.create_future())
        with self._lock:
            self._turns.append(request)
        self._kick_async(loop)
        try:
            reply = await request.done
        except ResponseError as error:
            return self._data_error(key, ask, error, now)
        if reply is DOWN:
            return self._while_down(key, ask, now)
        return self._answer(key, ask, reply, now)

    def take_turn_blocking(self, key: str, ask: TurnAsk, now: float) -> SharedTurn:
        """:meth:`take_turn` for a thread (``Throttle.acquire_blocking``)."""
        alone = self._alone_now(key, ask, now)
        if alone is not None:
            return alone
        request = self._ask(key, ask, now, threading.Event())
        with self._lock:
            self._sync_turns.append(request)
        with self._sync_sender:  # whoever holds it sends every turn waiting
            if not request.done.is_set():
                self._send_blocking()
        reply = request.reply
        if reply is DOWN:
            return self._while_down(key, ask, now)
        if isinstance(reply, ResponseError):
            return self._data_error(key, ask, reply, now)
        assert isinstance(reply, list)
        return self._answer(key, ask, reply, now)

    def changed(
        self, key: str, state: SlotState, now: float, *, sent_at: float, backed_off: bool
    ) -> None:
        """Share the slot's record soon (coalesced per slot, with the next message)."""
        with self._lock:
            previous = self._changes.get(key)
            if previous is not None and previous.backed_off and not backed_off:
                sent_at, backed_off = previous.sent_at, True  # the backoff still counts
            self._changes[key] = Change(state, now, sent_at, backed_off)
        self._flush_soon()

    def released(self, key: str, lease: str) -> None:
        """Hand a finished request's shared lease back (with the next message)."""
        with self._lock:
            self._releases.append((key, lease))
            del self._releases[:-MAX_PENDING]
        self._flush_soon()

    async def flush(self) -> None:
        """Send what is waiting (learned records, finished leases) now, if Redis answers."""
        if self._sender is not None and not self._sender.done():
            await asyncio.gather(self._sender, return_exceptions=True)
        if self._async is not None or self._url is not None:
            await self._send_async()
        else:
            await asyncio.to_thread(self._flush_blocking)

    def flush_blocking(self) -> None:
        """:meth:`flush` for a thread."""
        with self._sync_sender:
            self._send_blocking()

    async def aclose(self) -> None:
        """Flush, then close the Redis clients."""
        await self.flush()
        if self._async is not None:
            await self._async.aclose()
        self.close()

    def close(self) -> None:
        """Flush what the sync client has to send, stop its sender, close the sync client."""
        if self._closed:
            return
        if self._sync is not None:
            self.flush_blocking()
        with self._lock:
            self._closed = True
            self._wake_flusher.notify_all()
        if self._sync is not None:
            self._sync.close()

    async def shared_record(self, key: str) -> dict[str, Any] | None:
        """The fleet's last shared record of slot ``key`` (``SlotState.to_dict`` data)."""
        raw = await self._async_client().hget(self._keys(key)[0], "record")
        return None if raw is None else dict(json.loads(as_text(raw)))

    # -- what goes to Redis ---------------------------------------------------------

    def _keys(self, key: str) -> tuple[str, str, str]:
        tag = f"{{{self.prefix}:{key}}}"
        return f"{tag}:s", f"{tag}:l", f"{tag}:p"

    def _ask(self, key: str, ask: TurnAsk, now: float, done: Any) -> Ask:
        lease = uuid.uuid4().hex
        hold = ask.hold if math.isfinite(ask.hold) else 3_600.0
        with self._lock:
            memo = self._alone.get(key)
            paused = "" if memo is None or now < memo.paused_until else memo.paused
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
            paused,
            f"{ask.margin:.6f}",
            us(ask.late),
            f"{phase(key):.6f}",
        ]
        return Ask(key, args, lease, done)

    def _take_batch(self) -> tuple[list[tuple[str, str]], dict[str, Change]]:
        """The finished leases and changes waiting to go, taken under the lock."""
        with self._lock:
            releases, self._releases = self._releases, []
            changes, self._changes = self._changes, {}
        return releases, changes

    def _keep(self, releases: list[tuple[str, str]], changes: dict[str, Change]) -> None:
        """Put back what could not be sent, to go with the next message (rule 7)."""
        with self._lock:
            self._releases[:0] = releases
            del self._releases[:-MAX_PENDING]
            for key, change in changes.items():
                self._changes.setdefault(key, change)

    def _commands(
        self, turns: list[Ask], releases: list[tuple[str, str]], changes: dict[str, Change]
    ) -> list[tuple[str, tuple[Any, ...]]]:
        """The pipeline: leases handed back first (so turns see them free), changes, turns."""
        commands: list[tuple[str, tuple[Any, ...]]] = []
        for key, lease in releases:
            commands.append(("", ("ZREM", self._keys(key)[1], lease)))
        for key, change in changes.items():
            commands.append(("merge", (1, self._keys(key)[0], *self._merge_args(change))))
        for ask in turns:
            commands.append(("turn", (3, *self._keys(ask.key), *ask.args)))
        return commands

    def _merge_args(self, change: Change) -> list[str | int]:
        state, now = change.state, change.now
        pause = state.pause_until - now if math.isfinite(state.pause_until) else 0.0
        try:
            record = json.dumps(state.to_dict(now))
        except RuntimeError:  # changed by another thread meanwhile: sent with the next change
            record = ""
        return [
            us(state.delay),
            "1" if change.backed_off else "0",
            us(now - change.sent_at) if math.isfinite(change.sent_at) else "",
            us(max(0.0, pause)),
            record,
            round(self.ttl * 1000),
        ]

    # -- the async sender: one pipeline at a time, carrying whatever is waiting ----------

    def _async_client(self) -> AsyncClient:
        if self._async is None:
            if self._url is None:
                raise TypeError(
                    "RedisStore was given a sync redis client: async throttles need a "
                    "redis.asyncio client (or pass a URL)"
                )
            self._async = aioredis.Redis.from_url(self._url)
        return self._async

    def _kick_async(self, loop: asyncio.AbstractEventLoop, everything: bool = False) -> None:
        """Start the sender: for the turns waiting, or (``everything``) for all."""
        if everything:
            self._lingering = None
        if self._sender is None or self._sender.done():
            self._sender = loop.create_task(self._send_loop(everything))

    def _linger(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send finished leases and changes within ``LINGER``, with a turn if one comes."""
        if self._lingering is None:
            self._lingering = loop.call_later(LINGER, self._kick_async, loop, True)

    async def _send_loop(self, everything: bool) -> None:
        try:
            while await self._send_async(everything):
                everything = False
        except BaseException:
            with self._lock:
                stranded, self._turns = self._turns, []
            for ask in stranded:
                deliver(ask, DOWN)
            raise

    async def _send_async(self, everything: bool = True) -> bool:
        """Send one pipeline of what is waiting (without turns, only if ``everything``);
        False when there is nothing more to send."""
        with self._lock:
            turns, self._turns = self._turns, []
        if not (turns or everything):
            return False
        releases, changes = self._take_batch()
        if not (turns or releases or changes):
            return False
        if time.monotonic() < self._down_until:
            self._keep(releases, changes)
            for ask in turns:
                deliver(ask, DOWN)
            return False
        commands = self._commands(turns, releases, changes)
        try:
            client = self._async_client()
            if not self._ready_async:  # connecting and loading the scripts: more time
                await within(self._load_async(client), self.timeout * FIRST)
                self._ready_async = True
            results = await within(self._run_async(client, commands), self.timeout)
        except (TimeoutError, RedisError, OSError) as error:
            with self._lock:
                stranded, self._turns = self._turns, []
            self._failed(error, turns, releases, changes)
            for ask in turns + stranded:
                deliver(ask, DOWN)
            return False
        self._settle(commands, results, turns)
        for ask, result in zip(turns, results[len(results) - len(turns) :], strict=True):
            if not deliver(ask, result) and isinstance(result, list) and result[1]:
                self.released(ask.key, ask.lease)  # its asker gave up meanwhile
        return True

    async def _load_async(self, client: AsyncClient) -> None:
        for text, _ in self._scripts.values():
            await client.script_load(text)
        answers = []
        for _ in range(CALIBRATE):
            answers.append((await client.time(), time.monotonic()))
        self._server_clock.calibrate(answers)

    async def _run_async(
        self, client: AsyncClient, commands: list[tuple[str, tuple[Any, ...]]]
    ) -> list[Any]:
        self.round_trips += 1
        results = await self._pipeline_async(client, commands)
        missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing:  # a restarted or flushed Redis forgot the scripts: load them, send again
            for text, _ in self._scripts.values():
                await client.script_load(text)
            self.round_trips += 1
            again = await self._pipeline_async(client, [commands[i] for i in missing])
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        return results

    async def _pipeline_async(
        self, client: AsyncClient, commands: list[tuple[str, tuple[Any, ...]]]
    ) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for script, args in commands:
            if script:
                pipe.execute_command("EVALSHA", self._scripts[script][1], *args)
            else:
                pipe.execute_command(*args)
        return list(await pipe.execute(raise_on_error=False))

    # -- the sync sender: the thread holding the lock sends for every thread waiting ------

    def _sync_client(self) -> SyncClient:
        if self._sync is None:
            if self._url is None:
                raise TypeError(
                    "RedisStore was given a redis.asyncio client: acquire_blocking needs "
                    "a sync redis client (or pass a URL)"
                )
            self._sync = redis.Redis.from_url(
                self._url,
                socket_timeout=self.timeout,
                socket_connect_timeout=self.timeout * FIRST,
            )
        if not self._ready_sync:
            for text, _ in self._scripts.values():
                self._sync.script_load(text)
            self._server_clock.calibrate(
                [(self._sync.time(), time.monotonic()) for _ in range(CALIBRATE)]
            )
            self._ready_sync = True
        return self._sync

    def _send_blocking(self) -> None:
        with self._lock:
            turns, self._sync_turns = self._sync_turns, []
        releases, changes = self._take_batch()
        if not (turns or releases or changes):
            return
        replies: list[Any]
        if time.monotonic() < self._down_until:
            self._keep(releases, changes)
            replies = [DOWN] * len(turns)
        else:
            commands = self._commands(turns, releases, changes)
            try:
                replies = self._run_blocking(self._sync_client(), commands)
            except (RedisError, OSError) as error:
                self._failed(error, turns, releases, changes)
                self._flush_soon()  # the background sender tries again
                replies = [DOWN] * len(commands)
            else:
                self._settle(commands, replies, turns)
        for ask, reply in zip(turns, replies[len(replies) - len(turns) :], strict=True):
            ask.reply = reply
            ask.done.set()

    def _run_blocking(
        self, client: SyncClient, commands: list[tuple[str, tuple[Any, ...]]]
    ) -> list[Any]:
        def run(batch: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
            self.round_trips += 1
            pipe = client.pipeline(transaction=False)
            for script, args in batch:
                if script:
                    pipe.execute_command("EVALSHA", self._scripts[script][1], *args)
                else:
                    pipe.execute_command(*args)
            return list(pipe.execute(raise_on_error=False))

        results = run(commands)
        missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing:
            for text, _ in self._scripts.values():
                client.script_load(text)
            for i, result in zip(missing, run([commands[i] for i in missing]), strict=True):
                results[i] = result
        return results

    def _flush_blocking(self) -> None:
        with self._sync_sender:
            self._send_blocking()

    def _flusher_loop(self) -> None:
        """The sync side's background sender: finished leases and changes that no turn
        carried within ``LINGER`` go on their own; while Redis is down, every
        ``retry_after``."""
        while True:
            with self._lock:
                while not self._closed and not (self._releases or self._changes):
                    self._wake_flusher.wait()
                if self._closed:
                    return
            time.sleep(max(LINGER, self._down_until - time.monotonic()))
            self._flush_blocking()

    def _flush_soon(self) -> None:
        """Send soon: with the async sender on this thread's event loop, else from
        the background thread of the sync client."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None and (self._async is not None or self._url is not None):
            self._linger(loop)
            return
        if self._sync is None and self._url is None:
            return  # an async client and no loop here: it goes with the next turn
        with self._lock:
            if self._flusher is None and not self._closed:
                self._flusher = threading.Thread(
                    target=self._flusher_loop, name="autothrottle-redis", daemon=True
                )
                self._flusher.start()
            self._wake_flusher.notify()

    # -- failures (rules 6 and 7) -------------------------------------------------------

    def _failed(
        self,
        error: BaseException,
        turns: list[Ask],
        releases: list[tuple[str, str]],
        changes: dict[str, Change],
    ) -> None:
        """Redis did not answer: keep what was not sent, to send again (rule 7).

        A turn whose answer was lost may have been reserved: its lease is
        handed back too.
        """
        self._keep(releases + [(ask.key, ask.lease) for ask in turns], changes)
        self._went_down(error)

    def _went_down(self, error: BaseException) -> None:
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
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.call_later(self.retry_after, self._kick_async, loop, True)

    def _came_back(self) -> None:
        self._down_until = -math.inf
        if self._warned:
            self._warned = False
            logger.warning("autothrottle: Redis store %r reachable again; sharing", self.prefix)

    def _settle(
        self, commands: list[tuple[str, tuple[Any, ...]]], results: list[Any], turns: list[Ask]
    ) -> None:
        """Redis answered. A data error (a key of the wrong type) concerns its slot
        only; any other error (out of memory, read-only, loading) is the store's:
        the process goes alone (rule 6) and keeps the unsent leases (rule 7)."""
        failure = next(
            (r for r in results if isinstance(r, ResponseError) and type(r) is not ResponseError),
            None,
        )
        if failure is not None:
            unsent = [
                (args[1], args[2])
                for (script, args), result in zip(commands, results, strict=True)
                if not script and isinstance(result, ResponseError)
            ]
            self._keep(unsent, {})
            self._went_down(failure)
            for index in range(len(results) - len(turns), len(results)):
                if isinstance(results[index], ResponseError):
                    results[index] = DOWN
            return
        self._came_back()
        for (script, args), result in zip(commands, results, strict=True):
            if script != "turn" and isinstance(result, ResponseError):
                logger.warning(
                    "autothrottle: Redis store %r: data error at key %r (%s); not shared",
                    self.prefix,
                    args[1],
                    result,
                )

    def _data_error(self, key: str, ask: TurnAsk, error: ResponseError, now: float) -> SharedTurn:
        """A key of this slot holds something else: only this slot goes alone (rule 6)."""
        with self._lock:
            alone = self._alone.setdefault(key, Alone())
            first, alone.bad = not alone.bad, True
            alone.until = time.monotonic() + self.retry_after
        if first:
            logger.warning(
                "autothrottle: Redis store %r: data error for slot %r (%s); pacing that "
                "slot on this process's own state, retrying every %gs",
                self.prefix,
                key,
                error,
                self.retry_after,
            )
        return self._alone_turn(key, ask, now)

    def _alone_now(self, key: str, ask: TurnAsk, now: float) -> SharedTurn | None:
        """The turn while Redis is down or this slot's data is bad; None: ask Redis."""
        if time.monotonic() < self._down_until:
            return self._while_down(key, ask, now)
        alone = self._alone.get(key)
        if alone is not None and alone.bad and time.monotonic() < alone.until:
            return self._alone_turn(key, ask, now)
        return None

    def _while_down(self, key: str, ask: TurnAsk, now: float) -> SharedTurn:
        if self.fail_closed:
            return SharedTurn(max(self._down_until - time.monotonic(), 0.05), None, None, 0.0)
        return self._alone_turn(key, ask, now)

    def _alone_turn(self, key: str, ask: TurnAsk, now: float) -> SharedTurn:
        """This process's share of the fleet's last pace: the slot's gap times the
        processes that shared it; a slot never shared here yet, its own gap times
        the most processes seen on any slot."""
        with self._lock:
            alone = self._alone.setdefault(key, Alone())
            if alone.next > now:
                return SharedTurn(alone.next - now, None, None, 0.0)  # asks again then, and goes
            gap = alone.gap or ask.gap * ask.margin * self._processes
            alone.next = now + gap
        return ALONE

    def _answer(self, key: str, ask: TurnAsk, reply: list[Any], now: float) -> SharedTurn:
        waited, lease, delay, pause, processes, paused, server = (as_text(p) for p in reply)
        received = time.monotonic()
        wait = self._server_clock.wait(float(server) / 1e6, float(waited) / 1e6, received)
        if not lease:  # not a turn but "ask again then": never 0, which would mean "go alone"
            wait = max(wait, ASK_AGAIN)
        shared = float(delay) / 1e6 if delay else None
        gap = min(max(shared if shared is not None else ask.gap, ask.min_gap), ask.max_gap)
        with self._lock:
            alone = self._alone.get(key)
            if alone is None:
                alone = self._alone[key] = Alone()
            alone.gap = gap * ask.margin * max(1, int(processes))
            self._processes = max(self._processes, int(processes))
            if paused and paused != alone.paused:
                alone.paused, alone.paused_until = paused, now + wait
            again, alone.bad = alone.bad, False
        if again:
            logger.warning("autothrottle: Redis store %r: slot %r shared again", self.prefix, key)
        self.turns += 1
        due = received + wait if lease else None
        return SharedTurn(wait, lease or None, shared, float(pause) / 1e6, due, int(processes))
