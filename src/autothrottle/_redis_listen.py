"""How :class:`~autothrottle.redis.RedisStore` hears the pauses other processes set.

A pause another process of the fleet sets must reach this one before its
reserved turns go through it (rule 2 of :mod:`autothrottle._fleet`). It comes
on the prefix's pub/sub channel, on a connection of its own: a subscribed
connection can send nothing else, and nothing of it rides the pipelines of
:class:`~autothrottle._redis_send.Sender`, whose clients it borrows, whose
clock of Redis it reads and whose outage's ``retry_after`` it keeps to. It
holds no request and sends nothing, so it can fail, reconnect and be stopped
on its own; the process's runs of turns (:mod:`autothrottle._redis_runs`)
are told what it hears: a pause, and a pace a host stated to another process
that begins or widens (rule 8: a run reserved before it is void).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from ._redis_parts import as_text
from ._redis_send import Sender

__all__ = ["LISTEN_CHECK", "LISTEN_POLL", "Listener"]

logger = logging.getLogger("autothrottle")


LISTEN_POLL = 0.1
"""Seconds the sync client's listener waits for a message before it looks
whether its store was closed (what closing it may wait)."""

LISTEN_CHECK = 1.0
"""Seconds the async client's listener waits for a message before it looks
whether its store was closed or its task cancelled. A cancel ends it at once;
this bounds only a cancel the client lost (what a program's exit may then wait).
Each look costs about 0.3 ms of CPU in redis-py 8 (measured: 26-32 ms over 10 s
idle at 0.1 s), hence not :data:`LISTEN_POLL`."""

LISTEN_JOIN = 2.0
"""Seconds closing a store waits at most for its listener to end, and a listener
for its connection to close (it may be talking to a slow Redis)."""


_LISTENING: set[asyncio.Task[None]] = set()
"""The subscribers' tasks under way: an event loop holds its tasks only weakly,
and one whose store was dropped would be collected while pending."""


class Listener:
    """Hears the pauses other processes of the fleet set (rule 2).

    A turn this process reserved waits for its due time without asking Redis
    again; a pause another process sets meanwhile (a host's ``Retry-After``,
    a spent budget, ``backoff(pause=)``) would reach this process only with
    the store's next answer for the slot, after the turn went through it
    (loaded fleet crawls sent 7-8 requests into a 2-s pause so). The merge
    script publishes every pause it sets or extends on the prefix's channel
    (:func:`~autothrottle._redis_parts.channel`); one subscriber per store,
    started with its first reserved turn (a connection of its own: the turns'
    pipelines gain no round trip), hands each pause another process set to
    ``heard(slot, end, until)``: ``end`` as Redis stamped it, ``until`` on
    ``time.monotonic``'s clock (:class:`ServerClock`'s mapping). Classic
    pub/sub reaches every node of a Redis Cluster, so a subscriber on any
    node hears every shard's pauses. The merge script publishes on the same
    channel a pace a host stated to a process when it begins or widens by
    more than a quarter (``stated gap until now process slot``), handed to
    ``stated(slot, gap, until, now)`` in seconds, ``until`` on
    ``time.monotonic``'s clock, ``now`` Redis's stamp of the merge (µs): a run
    of turns this process reserved before it, narrower, is void (rule 8).

    It never holds a request: while Redis is down or slow it tries again
    every ``retry_after`` seconds, logging at debug level only (the outage
    is the turns' to tell); a pause published while it is not subscribed
    reaches the process with the store's next answer for the slot, as
    without it.
    """

    __slots__ = (
        "_heard",
        "_lock",
        "_sender",
        "_stated",
        "_stop",
        "_task",
        "_thread",
        "heard",
        "listening",
    )

    def __init__(
        self,
        sender: Sender,
        heard: Callable[[str, str, float], None],
        stated: Callable[[str, float, float, float], None] | None = None,
    ) -> None:
        self._sender = sender
        self._heard = heard
        self._stated = stated
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.listening = False
        """Subscribed: the pauses published from now on are heard."""
        self.heard = 0
        """Pauses other processes set that this one heard so far (any slot)."""

    def start(self) -> None:
        """Listen from now on, on this thread's event loop if it has one (the
        async client), else on a thread of its own (the sync client); once."""
        if self._task is not None or self._thread is not None or self._stop.is_set():
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        sender = self._sender
        with self._lock:
            if self._task is not None or self._thread is not None or self._stop.is_set():
                return
            if loop is not None and sender.async_client is not None:
                self._task = task = loop.create_task(self._listen_async())
                _LISTENING.add(task)  # held until it ends: never destroyed pending
                task.add_done_callback(_LISTENING.discard)
            elif loop is None and sender.sync_client is not None:
                self._thread = threading.Thread(
                    target=self._listen_blocking, name="autothrottle-redis-pauses", daemon=True
                )
                self._thread.start()

    async def _listen_async(self) -> None:
        """Listen until stopped or cancelled, however the client takes a cancel.

        redis-py 8 can lose a cancel: its sends go through ``asyncio.wait_for``
        (a 5-s ``socket_timeout`` by default), which on Python 3.11 returns the
        send's result when the cancel lands as the send completes. A cancel lost
        in ``subscribe`` left the task "cancelling" in a read waiting for no
        timeout, for ever, and ``asyncio.run`` never returned (its shutdown cancels
        each task once and waits). So it reads for :data:`LISTEN_CHECK` at most,
        then looks whether it was stopped or cancelled (``cancelling()``), and
        closes its connection within :data:`LISTEN_JOIN`."""
        client = self._sender.async_client
        assert client is not None
        task = asyncio.current_task()
        assert task is not None
        while not self._stop.is_set():
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self._sender.channel)
                while not self._stop.is_set():
                    if task.cancelling():
                        raise asyncio.CancelledError
                    self._message(await pubsub.get_message(timeout=LISTEN_CHECK))
            except (RedisError, OSError) as error:
                self._lost(error)
            finally:
                self.listening = False
                with contextlib.suppress(RedisError, OSError, TimeoutError):
                    async with asyncio.timeout(LISTEN_JOIN):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]
            if task.cancelling():
                raise asyncio.CancelledError
            await asyncio.sleep(self._sender.outage.retry_after)

    def _listen_blocking(self) -> None:
        client = self._sender.sync_client
        assert client is not None
        while not self._stop.is_set():
            pubsub = client.pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(self._sender.channel)
                while not self._stop.is_set():
                    self._message(pubsub.get_message(timeout=LISTEN_POLL))
            except (RedisError, OSError) as error:
                self._lost(error)
            finally:
                self.listening = False
                with contextlib.suppress(RedisError, OSError):
                    pubsub.close()
            self._stop.wait(self._sender.outage.retry_after)

    def _message(self, message: dict[str, Any] | None) -> None:
        """A pause told on the channel: ``end now process slot`` (Redis's clock, µs),
        or a stated pace (:meth:`_stated_pace`)."""
        if message is None:
            return
        kind = as_text(message.get("type"))
        if kind == "subscribe":
            self.listening = True
        if kind != "message":
            return
        try:
            data = as_text(message["data"])
            if data.startswith("stated "):
                self._stated_pace(data)
                return
            end, server, process, key = data.split(" ", 3)
            end_us, server_us = int(end), int(server)
        except (KeyError, ValueError):  # not the merge script's: not ours to read
            return
        if process == self._sender.process:  # this process's own pause: its slot has it
            return
        self.heard += 1
        received = time.monotonic()
        wait = self._sender.server_clock.wait(server_us / 1e6, (end_us - server_us) / 1e6, received)
        self._heard(key, end, received + wait)

    def _stated_pace(self, data: str) -> None:
        """A pace a host stated to another process began or widened: ``stated gap
        until now process slot`` (µs; the times on Redis's clock)."""
        try:
            _, gap, until, server, process, key = data.split(" ", 5)
            gap_us, until_us, server_us = int(gap), int(until), int(server)
        except ValueError:  # not the merge script's: not ours to read
            return
        if process == self._sender.process or self._stated is None:
            return  # this process's own: its gate and its runs have it
        received = time.monotonic()
        left = (until_us - server_us) / 1e6
        wait = self._sender.server_clock.wait(server_us / 1e6, left, received)
        self._stated(key, gap_us / 1e6, received + wait, server_us)

    def _lost(self, error: BaseException) -> None:
        logger.debug(
            "autothrottle: Redis store %r: not hearing the fleet's pauses for now (%s: %s)",
            self._sender.prefix,
            type(error).__name__,
            error,
        )

    async def aclose(self) -> None:
        """Stop listening and close the subscriber's connection (awaited)."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()  # it ends within LISTEN_CHECK even if the client loses the cancel
            await asyncio.wait({task}, timeout=LISTEN_JOIN + LISTEN_CHECK)
        self.close()

    def dropped(self) -> None:
        """Its store was collected unclosed: stop listening, from whatever thread
        the collection ran on. The task is cancelled on its loop (a loop already
        closed runs nothing any more), the thread ends within :data:`LISTEN_POLL`
        (not waited: a collection must not block); either closes its connection."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None and not task.done():
            with contextlib.suppress(RuntimeError):  # its loop is closed
                task.get_loop().call_soon_threadsafe(task.cancel)

    def close(self) -> None:
        """Stop listening: the thread ends within :data:`LISTEN_POLL` (waited here,
        at most :data:`LISTEN_JOIN`); a task is cancelled (:meth:`aclose` awaits it)."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(LISTEN_JOIN)
