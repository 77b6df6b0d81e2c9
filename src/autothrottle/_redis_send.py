"""What :class:`~autothrottle.redis.RedisStore` sends, and how: one pipeline at a time.

Everything a process has to say goes in one pipeline: the turns asked for at
the same moment (of any slots), the finished leases and what responses taught,
so a request costs at most one round trip, and less when requests come
together. Finished leases and changes wait for a turn to carry them: up to
:data:`LINGER` when the fleet needs them soon (a backoff, a lease of a slot
near its cap), up to :data:`LINGER_MOST` otherwise.

Async throttles send from one task on their event loop (``redis.asyncio``);
sync throttles send from the thread that holds the sender lock, for every
thread waiting, and a background thread sends what no turn carried
(``redis``'s sync client). When a call fails or is slow, :class:`Sender` tells
the :class:`~autothrottle._redis_outage.Outage`, keeps what was not sent to
send again (rule 7) and answers the turns waiting with :data:`DOWN`; so too
when a pipeline ends any other way (cancelled, a fault), and no turn taken
for it is left unanswered. A change whose command cannot be built is dropped,
not kept: kept, it would fail every pipeline after it.

The pauses other processes set are heard apart, on a connection of its own
(:mod:`autothrottle._redis_listen`): nothing of them rides the pipelines.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError, ResponseError

from ._redis_lua import GIVE_BACK, LOOK, MERGE, TURN
from ._redis_outage import Outage
from ._redis_parts import (
    CALIBRATE,
    CALIBRATE_MOST,
    CALIBRATE_RTT,
    DOWN,
    FIRST,
    LINGER,
    LINGER_MOST,
    MAX_PENDING,
    Ask,
    AsyncClient,
    Change,
    ServerClock,
    SyncClient,
    as_text,
    channel,
    deliver,
    keys,
    merge_args,
    run_leases,
    sha,
    us,
    within,
)

__all__ = ["Sender"]

logger = logging.getLogger("autothrottle")

Commands = list[tuple[str, tuple[Any, ...]]]

UNSENT_MOST = 1_000
"""Slots whose changes cannot be sent that are remembered, to log each once."""


class Sender:
    """The queues of what waits to go to Redis, the clients, and the pipelines.

    ``url``, ``async_client`` and ``sync_client`` as given to ``RedisStore``;
    ``ttl`` and ``timeout`` its settings; ``process`` names this process in
    the pauses it tells the fleet of (rule 2).
    """

    def __init__(
        self,
        outage: Outage,
        *,
        prefix: str,
        process: str = "",
        url: str | None,
        async_client: AsyncClient | None,
        sync_client: SyncClient | None,
        ttl: float,
        timeout: float,
    ) -> None:
        self.outage = outage
        self.prefix = prefix
        self.process = process
        self.channel = channel(prefix)
        self.url = url
        self.async_client: AsyncClient | None = async_client
        self.sync_client: SyncClient | None = sync_client
        self.ttl = ttl
        self.timeout = timeout
        self.server_clock = ServerClock()
        self.round_trips = 0
        self._scripts = {
            name: (text, sha(text))
            for name, text in (
                ("turn", TURN),
                ("look", LOOK),
                ("merge", MERGE),
                ("give_back", GIVE_BACK),
            )
        }
        self._lock = threading.Lock()
        self._turns: list[Ask] = []
        self._sync_turns: list[Ask] = []
        self._releases: list[tuple[str, str]] = []
        self._changes: dict[str, Change] = {}
        self._unused: dict[str, tuple[float, list[str]]] = {}
        self._unsent: set[str] = set()  # slots whose last change could not be built
        self._sender: asyncio.Task[None] | None = None
        self._lingering: asyncio.TimerHandle | None = None
        self._retrying: asyncio.TimerHandle | None = None  # Redis down: the next try
        self._sync_sender = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._wake_flusher = threading.Condition(self._lock)
        self._closed = False
        self._ready_async = self._ready_sync = False
        self._flush_at = math.inf  # when what waits must go (monotonic)

    # -- what waits to go -------------------------------------------------------------

    def turn(self, ask: Ask, loop: asyncio.AbstractEventLoop) -> None:
        """Send an async turn with the next pipeline (one starts now if none is under way)."""
        if self.async_client is None and self.url is None:
            self.async_redis()  # the TypeError naming the mix-up, raised to the asker
        with self._lock:
            self._turns.append(ask)
        self._kick_async(loop)

    def turn_blocking(self, ask: Ask) -> None:
        """Send a sync turn; on return its reply is in ``ask.reply``."""
        if self.sync_client is None and self.url is None:
            self._sync_redis()  # the TypeError naming the mix-up, raised to the asker
        with self._lock:
            self._sync_turns.append(ask)
        with self._sync_sender:  # whoever holds it sends every turn waiting
            if not ask.done.is_set():
                self._send_blocking()

    def changed(self, key: str, change: Change) -> None:
        """Share the slot's record soon (coalesced per slot; a backoff still counts):
        a backoff or a stated pace that began within :data:`LINGER` (the other
        processes' turns need it: rules 1 and 8), anything else within
        :data:`LINGER_MOST`."""
        with self._lock:
            previous = self._changes.get(key)
            if previous is not None:
                change.oks += previous.oks
                change.began = change.began or previous.began
                if previous.backed_off and not change.backed_off:
                    change.sent_at, change.backed_off = previous.sent_at, True
            self._changes[key] = change
            linger = LINGER if change.backed_off or change.began else LINGER_MOST
            self._flush_at = min(self._flush_at, time.monotonic() + linger)
        self._flush_soon(linger)

    def released(self, key: str, lease: str, linger: float = LINGER) -> None:
        """Hand a finished lease back within ``linger`` seconds."""
        with self._lock:
            self._releases.append((key, lease))
            del self._releases[:-MAX_PENDING]
            self._flush_at = min(self._flush_at, time.monotonic() + linger)
            closed = self._closed
        if closed:
            self._after_close()
        else:
            self._flush_soon(linger)

    def unused(self, key: str, gap: float, leases: list[str]) -> None:
        """Hand back turns of a run that no request took (rule 8): the latest
        reserved give their time back to the fleet."""
        if not leases:
            return
        with self._lock:
            _, waiting = self._unused.get(key, (gap, []))
            self._unused[key] = (gap, waiting + leases)
            self._flush_at = min(self._flush_at, time.monotonic() + LINGER)
            closed = self._closed
        if closed:
            self._after_close()
        else:
            self._flush_soon()

    async def flush(self) -> None:
        lingering = self._lingering
        if lingering is not None:  # what it would send goes now: no timer left behind
            lingering.cancel()
            self._lingering = None
        sender = self._sender
        if sender is not None and not sender.done():
            # Waited, not gathered: a flush cancelled (an aclose under a timeout)
            # leaves the pipeline under way to answer its turns.
            await asyncio.wait((sender,))
        if self.async_client is not None or self.url is not None:
            await self._send_async()
        else:
            await asyncio.to_thread(self.flush_blocking)

    def flush_blocking(self) -> None:
        with self._sync_sender:
            self._send_blocking()

    def close(self) -> None:
        """Flush what the sync client has to send, stop its sender, close the sync
        client; cancel the timers (a linger, a retry while Redis is down). What
        a thread hands back after this goes at once (:meth:`_after_close`)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # a lease handed back from now on is its sender's to send
            self._wake_flusher.notify_all()
        for timer in (self._retrying, self._lingering):  # nothing starts a send any more
            if timer is not None:
                timer.cancel()
        self._retrying = self._lingering = None
        if self.sync_client is not None:
            with self._sync_sender:
                self._send_blocking()
                self.sync_client.close()

    def _after_close(self) -> None:
        """A thread's request outlived the store's close (a sync crawl shut down
        mid-request, its response finished later, or a turn it took after): what
        it hands back goes now, through the sync client, closed again after. No
        sender runs any more, and waiting, its lease would hold the fleet's cap
        until ``hold_timeout``. On an event loop it goes as before the close,
        through the async client; a store of an async client alone keeps it."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            self._flush_soon()
            return
        if self.sync_client is None and self.url is None:
            return
        with self._sync_sender:
            self._send_blocking()
            if self.sync_client is not None:
                self.sync_client.close()

    def _take_batch(self) -> tuple[list[tuple[str, str]], dict[str, Change]]:
        """The finished leases and changes waiting to go, taken under the lock
        (unused turns ride with the leases)."""
        with self._lock:
            releases, self._releases = self._releases, []
            changes, self._changes = self._changes, {}
            unused, self._unused = self._unused, {}
            self._flush_at = math.inf
        for key, (gap, leases) in unused.items():
            releases.append((key, f"{gap:.6f}\n" + "\n".join(leases)))
        return releases, changes

    def _keep(self, releases: list[tuple[str, str]], changes: dict[str, Change]) -> None:
        """Put back what could not be sent, to go with the next message (rule 7)."""
        with self._lock:
            self._releases[:0] = releases
            del self._releases[:-MAX_PENDING]
            for key, change in changes.items():
                self._changes.setdefault(key, change)
            self._flush_at = min(self._flush_at, time.monotonic() + LINGER)

    def _commands(
        self, turns: list[Ask], releases: list[tuple[str, str]], changes: dict[str, Change]
    ) -> Commands:
        """The pipeline: leases handed back first (so turns see them free), changes, turns."""
        commands: Commands = []
        for key, lease in releases:
            if "\n" in lease:  # a run's unused turns: the gap, then the leases
                gap, *leases = lease.split("\n")
                names = keys(self.prefix, key)[:2]
                commands.append(("give_back", (2, *names, us(float(gap)), *leases)))
            else:
                commands.append(("", ("ZREM", keys(self.prefix, key)[1], lease)))
        for key, change in changes.items():
            try:
                args = merge_args(change, self.ttl, self.channel, self.process, key)
            except Exception as error:  # any: that one change is dropped
                self._unsendable(key, error)
                continue
            if self._unsent:
                self._unsent.discard(key)
            commands.append(("merge", (1, keys(self.prefix, key)[0], *args)))
        for ask in turns:  # a turn, or a late turn's look
            commands.append((ask.script, (3, *keys(self.prefix, ask.key), *ask.args)))
        return commands

    def _unsendable(self, key: str, error: Exception) -> None:
        """A change whose command cannot be built (a record that is not JSON: a
        custom policy's state, a delay that is no number) is dropped, not kept:
        kept, it would fail every send after it, and the whole process would
        pace as if Redis were down. The fleet misses what that one change said;
        the slot's next change is tried afresh. Logged at error level once for
        as long as the slot's changes keep failing (each response makes one),
        for up to :data:`UNSENT_MOST` slots at a time (more, and they are
        logged again: a policy whose every record fails leaves no set growing
        with the hosts of a crawl)."""
        if key in self._unsent:
            logger.debug("autothrottle: Redis store %r: slot %r not shared", self.prefix, key)
            return
        if len(self._unsent) >= UNSENT_MOST:
            self._unsent.clear()
        self._unsent.add(key)
        logger.error(
            "autothrottle: Redis store %r: the change of slot %r cannot be sent (%s: %s); "
            "dropped, the fleet keeps its last record of the slot",
            self.prefix,
            key,
            type(error).__name__,
            error,
            exc_info=error,
        )

    # -- the async sender: one pipeline at a time, carrying whatever is waiting ----------

    def async_redis(self) -> AsyncClient:
        if self.async_client is None:
            if self.url is None:
                raise TypeError(
                    "RedisStore was given a sync redis client: async throttles need a "
                    "redis.asyncio client (or pass a URL)"
                )
            self.async_client = aioredis.Redis.from_url(self.url)
        return self.async_client

    def _kick_async(self, loop: asyncio.AbstractEventLoop, everything: bool = False) -> None:
        """Start the sender: for the turns waiting, or (``everything``) for all."""
        if everything:
            self._lingering = None
        if self._sender is None or self._sender.done():
            self._sender = loop.create_task(self._send_loop(everything))

    def _linger(self, loop: asyncio.AbstractEventLoop, linger: float) -> None:
        """Send finished leases and changes within ``linger``, with a turn if one comes."""
        lingering = self._lingering
        if lingering is not None:
            if lingering.when() <= loop.time() + linger:
                return
            lingering.cancel()
        self._lingering = loop.call_later(linger, self._kick_async, loop, True)

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
        if self.outage.down():
            self._keep(releases, changes)
            for ask in turns:
                deliver(ask, DOWN)
            return False
        try:
            commands = self._commands(turns, releases, changes)
            client = self.async_redis()
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
        except BaseException as error:
            if self._broken(error, turns, releases, changes):
                raise
            return False
        replies = results[len(results) - len(turns) :]
        try:
            self._settle(commands, results, turns)
            for ask, result in zip(turns, replies, strict=True):
                if not deliver(ask, result):
                    self._given_up(ask, result)
        except BaseException as error:
            # Redis answered: what was taken went, and the answers say what it reserved.
            if self._broken(error, turns, [], {}, replies):
                raise
            return False
        return True

    def _given_up(self, ask: Ask, reply: Any) -> None:
        """Nobody takes the answer ``reply`` to the turn ``ask`` (its request gave
        up before it came, or a fault ended the pipeline while it was settled):
        every turn of the run Redis reserved goes back, the latest first, and
        its time with it when no process reserved after it (rule 8). A look
        reserves nothing (its lease goes with its request), nor does an answer
        without a lease (a pause, the cap, a data error); an answer of a shape
        not expected is as one lost: its leases go back, not its time."""
        if ask.script != "turn" or not isinstance(reply, list):
            return
        try:
            if not reply[1]:
                return
            turns = int(as_text(reply[7])) if len(reply) > 7 else 1
            gap = float(as_text(reply[8])) / 1e6 if len(reply) > 8 else 0.0
        except (IndexError, TypeError, ValueError, UnicodeDecodeError):
            self._keep(_reserved(ask), {})
            self._flush_soon()
            return
        self.unused(ask.key, gap, run_leases(ask.lease, turns)[::-1])

    async def _load_async(self, client: AsyncClient) -> None:
        for text, _ in self._scripts.values():
            await client.script_load(text)
        clean, answers = False, list[tuple[Any, float]]()
        while len(answers) < CALIBRATE_MOST and not (clean and len(answers) >= CALIBRATE):
            asked = time.monotonic()
            answer = await client.time()
            received = time.monotonic()
            answers.append((answer, received))
            clean = clean or received - asked <= CALIBRATE_RTT
        self.server_clock.calibrate(answers)

    async def _run_async(self, client: AsyncClient, commands: Commands) -> list[Any]:
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

    async def _pipeline_async(self, client: AsyncClient, commands: Commands) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for script, args in commands:
            if script:
                pipe.execute_command("EVALSHA", self._scripts[script][1], *args)
            else:
                pipe.execute_command(*args)
        return list(await pipe.execute(raise_on_error=False))

    # -- the sync sender: the thread holding the lock sends for every thread waiting ------

    def _sync_redis(self) -> SyncClient:
        if self.sync_client is None:
            if self.url is None:
                raise TypeError(
                    "RedisStore was given a redis.asyncio client: acquire_blocking needs "
                    "a sync redis client (or pass a URL)"
                )
            self.sync_client = redis.Redis.from_url(
                self.url,
                socket_timeout=self.timeout,
                socket_connect_timeout=self.timeout * FIRST,
            )
        if not self._ready_sync:
            for text, _ in self._scripts.values():
                self.sync_client.script_load(text)
            clean, answers = False, list[tuple[Any, float]]()
            while len(answers) < CALIBRATE_MOST and not (clean and len(answers) >= CALIBRATE):
                asked = time.monotonic()
                answer = self.sync_client.time()
                received = time.monotonic()
                answers.append((answer, received))
                clean = clean or received - asked <= CALIBRATE_RTT
            self.server_clock.calibrate(answers)
            self._ready_sync = True
        return self.sync_client

    def _send_blocking(self) -> None:
        with self._lock:
            turns, self._sync_turns = self._sync_turns, []
        releases, changes = self._take_batch()
        if not (turns or releases or changes):
            return
        replies: list[Any]
        if self.outage.down():
            self._keep(releases, changes)
            replies = [DOWN] * len(turns)
        else:
            try:
                commands = self._commands(turns, releases, changes)
                replies = self._run_blocking(self._sync_redis(), commands)
            except (RedisError, OSError) as error:
                self._failed(error, turns, releases, changes)
                self._flush_soon()  # the background sender tries again
                replies = [DOWN] * len(turns)
            except BaseException as error:
                if self._broken(error, turns, releases, changes):
                    raise
                return
            else:
                try:
                    self._settle(commands, replies, turns)
                except BaseException as error:
                    answers = replies[len(replies) - len(turns) :]
                    if self._broken(error, turns, [], {}, answers):  # Redis answered
                        raise
                    return
        for ask, reply in zip(turns, replies[len(replies) - len(turns) :], strict=True):
            ask.reply = reply
            ask.done.set()

    def _run_blocking(self, client: SyncClient, commands: Commands) -> list[Any]:
        def run(batch: Commands) -> list[Any]:
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

    def _flusher_loop(self) -> None:
        """The sync side's background sender: finished leases and changes that no turn
        carried in time (:meth:`_flush_soon`) go on their own; while Redis is
        down, every ``retry_after``."""
        while True:
            with self._lock:
                while not self._closed:
                    if self._releases or self._changes or self._unused:
                        at = max(self._flush_at, self.outage.down_until)
                        if at <= time.monotonic():
                            break
                        self._wake_flusher.wait(at - time.monotonic())
                    else:
                        self._wake_flusher.wait()
                if self._closed:
                    return
            self.flush_blocking()

    def _flush_soon(self, linger: float = LINGER) -> None:
        """Send within ``linger``: with the async sender on this thread's event
        loop, else from the background thread of the sync client."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None and (self.async_client is not None or self.url is not None):
            self._linger(loop, linger)
            return
        if self.sync_client is None and self.url is None:
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

        A turn whose answer was lost may have been reserved: its leases are
        handed back too (a look's is its request's, still in flight).
        """
        lost = [lease for ask in turns for lease in _reserved(ask)]
        self._keep(releases + lost, changes)
        self._went_down(error)

    def _broken(
        self,
        error: BaseException,
        turns: list[Ask],
        releases: list[tuple[str, str]],
        changes: dict[str, Change],
        replies: list[Any] | None = None,
    ) -> bool:
        """Something other than Redis failing ended a pipeline before its turns were
        answered: its sender cancelled mid-call (a cancelled task, the event loop
        ending, an interrupt in the sending thread), a cancel redis-py raised of
        its own, a fault (ours, redis-py's, a reply of a shape not expected).

        Each turn not answered yet is answered :data:`DOWN`, so its request, and
        those waiting behind it, go on as while Redis is down instead of waiting
        for ever. What Redis may have reserved for it goes back: with Redis's
        ``replies`` (the fault struck as they were settled) the run each
        reserved, its time too when nobody reserved after it, as for a request
        that gave up (:meth:`_given_up`: left in Redis, that time is a hole in
        the slot's pace, a gap per turn); without them (the answers lost) the
        leases it may hold, not their time, which no answer told. The leases
        and changes taken for the pipeline are kept to go again (rule 7), not
        left to expire in Redis. A fault is logged with its traceback and
        counts as Redis failing (tried again in ``retry_after``); a cancel or an
        interrupt is not Redis's: what was kept goes soon, and the caller
        re-raises it (True).
        """
        lost: list[tuple[str, str]] = []
        for index, ask in enumerate(turns):
            done = ask.done
            if isinstance(done, threading.Event):
                if done.is_set():
                    continue
                ask.reply = DOWN
                done.set()
            elif not deliver(ask, DOWN) and not done.cancelled():
                continue  # answered with its result: its lease is its request's
            if replies is None:
                lost += _reserved(ask)
            else:
                self._given_up(ask, replies[index])
        self._keep(releases + lost, changes)
        stopping = not isinstance(error, Exception)
        if isinstance(error, asyncio.CancelledError):  # the task's, or redis-py's own
            stopping = _cancelling()
        if not stopping:
            logger.error(
                "autothrottle: Redis store %r: a send failed unexpectedly (%s: %s)",
                self.prefix,
                type(error).__name__,
                error,
                exc_info=error,
            )
            self._went_down(error)
        if not self._closed:
            self._flush_soon()  # (while Redis counts as down, once it is tried again)
        return stopping

    def _went_down(self, error: BaseException) -> None:
        """Pace alone, and try Redis again in ``retry_after`` (the async side)."""
        self.outage.went_down(error)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        retrying = self._retrying
        if retrying is not None:
            retrying.cancel()
        if self._closed:  # no send starts after the close
            self._retrying = None
            return
        self._retrying = loop.call_later(self.outage.retry_after, self._retry, loop)

    def _retry(self, loop: asyncio.AbstractEventLoop) -> None:
        """``retry_after`` has passed since Redis went down: try it again."""
        self._retrying = None
        self._kick_async(loop, True)

    def _settle(self, commands: Commands, results: list[Any], turns: list[Ask]) -> None:
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
        self.outage.came_back()
        for (script, args), result in zip(commands, results, strict=True):
            if script not in ("turn", "look") and isinstance(result, ResponseError):
                logger.warning(
                    "autothrottle: Redis store %r: data error at key %r (%s); not shared",
                    self.prefix,
                    args[1],
                    result,
                )


def _reserved(ask: Ask) -> list[tuple[str, str]]:
    """What Redis may have reserved for a turn whose answer was lost: the leases of
    the run it asked for, none for a look (its lease is its request's, still in
    flight)."""
    if ask.script != "turn":
        return []
    return [(ask.key, lease) for lease in run_leases(ask.lease, ask.turns)]


def _cancelling() -> bool:
    """Whether the task running is being cancelled (a cancel raised while it is
    not came from inside a call: redis-py's own)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # a thread: no task to cancel
        return False
    return task is not None and task.cancelling() > 0
