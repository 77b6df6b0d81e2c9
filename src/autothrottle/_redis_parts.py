"""The parts of :class:`~autothrottle.redis.RedisStore` that hold no connection: the
turns and changes waiting for a pipeline, what a process keeps of a slot to pace
alone, Redis's clock as the process sees it, and a call's bounded wait."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import zlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.cluster

from ._fleet import SharedTurn
from ._state import SlotState

__all__ = [
    "ALONE",
    "ASK_AGAIN",
    "Alone",
    "Ask",
    "AsyncClient",
    "CALIBRATE",
    "CALIBRATE_MOST",
    "CALIBRATE_RTT",
    "Change",
    "DOWN",
    "FIRST",
    "LINGER",
    "LINGER_MOST",
    "FREE_TO_LINGER",
    "MAX_PENDING",
    "ServerClock",
    "SyncClient",
    "deliver",
    "channel",
    "keys",
    "merge_args",
    "phase",
    "run_leases",
    "sha",
    "as_text",
    "us",
    "within",
]

ALONE = SharedTurn(0.0, None, None, 0.0)
"""Go on local pacing alone (rule 6)."""

MAX_PENDING = 100_000
"""Finished leases kept for resending while Redis is down; older ones expire on their own."""

ASK_AGAIN = 0.001
"""The least wait before asking again (a pause ending, the fleet at its cap)."""

CLOCK_WINDOW = 10.0
"""Seconds over which the fastest answer sets Redis's clock offset (two windows)."""

FIRST = 4.0
"""A first call (connecting, loading the scripts) may take this many times ``timeout``."""

CALIBRATE = 5
"""``TIME`` calls that first set Redis's clock offset (:class:`ServerClock`)."""

CALIBRATE_RTT = 0.002
"""Seconds: a ``TIME`` call answered within this is clean (the process did not
stand still between Redis's answer and reading it)."""

CALIBRATE_MOST = 50
"""The most ``TIME`` calls at connection: past :data:`CALIBRATE`, until one is
clean. Four processes starting on a machine at load 9-12 had mapped Redis's
clock 100-370 ms apart from five calls each (every answer read late), and
their first sends met within a gap at the hosts."""

SLICES = 5
"""A Redis call's ``timeout`` is waited in this many slices (:func:`within`)."""

LINGER = 0.02
"""Seconds finished leases and changes the fleet needs soon (a backoff, the lease
of a slot near its cap) wait for a turn to carry them before they go on their
own: a crawl's turns come often, so most ride along and a request costs one
round trip, not two."""

FREE_TO_LINGER = 2
"""A finished lease lingers longer than :data:`LINGER` only when its slot had
at least this many leases free under the fleet's cap at its last turn."""

LINGER_MOST = 0.1
"""Seconds any other finished lease or change waits for a turn to carry it: a
slot far from its cap loses nothing when its finished leases reach the fleet
a little later, and over few hosts, whose turns come seldom, most then still
ride along. Measured with ``benchmarks/redis_store.py --hosts 20`` at load
9-10: 0.97-1.00 round trips a request with :data:`LINGER` alone, 0.85-0.88
with this, 0.77-0.81 with 0.25 s; two runs of that gave 92-93 % of the
aggregate against 94.5-95 % (a slot's finished leases count against the
fleet's cap until they reach it), so the shorter one stays."""

_T = TypeVar("_T")

AsyncClient = aioredis.Redis | aiocluster.RedisCluster
SyncClient = redis.Redis | redis.cluster.RedisCluster


class Down:
    """The answer to a turn when Redis is unreachable or slow: it goes alone (rule 6)."""


DOWN = Down()


class Ask:
    """One turn waiting to be sent, and, once sent, its reply: ``script`` is
    "turn" (reserve a run of ``turns``) or "look" (may a late turn ``lease`` go
    now). ``turns`` is what Redis may have reserved under ``lease`` when an
    answer is lost (a look reserves none)."""

    __slots__ = ("args", "done", "key", "lease", "reply", "script", "turns")

    def __init__(
        self,
        key: str,
        args: list[str | int],
        lease: str,
        done: Any,
        script: str = "turn",
        turns: int = 1,
    ) -> None:
        self.key = key
        self.args = args
        self.lease = lease
        self.done = done  # an asyncio.Future, or a threading.Event
        self.script = script
        self.turns = turns
        self.reply: list[Any] | BaseException | Down | None = None


class Change:
    """A slot's record to merge into the fleet's, with what the responses since the
    last change said: ``oks`` successes, a backoff, a ``strict`` pace, a stated
    pace that ``began``."""

    __slots__ = ("backed_off", "began", "now", "oks", "sent_at", "state", "strict")

    def __init__(
        self,
        state: SlotState,
        now: float,
        sent_at: float,
        backed_off: bool,
        oks: int = 0,
        strict: bool = False,
        began: bool = False,
    ) -> None:
        self.state, self.now, self.sent_at, self.backed_off = state, now, sent_at, backed_off
        self.oks, self.strict, self.began = oks, strict, began


class Alone:
    """What this process keeps of one slot for the fleet: its share of the fleet's
    pace (to pace alone), the pause it waited out, and a data error."""

    __slots__ = ("after", "bad", "gap", "gap_until", "next", "paused", "paused_until", "until")

    def __init__(self) -> None:
        # The fleet's pause this process waits for (its end on Redis's clock, µs),
        # waited out from paused_until on (the throttle's clock).
        self.paused = ""
        self.paused_until = math.inf
        # The share of the fleet's pace, until gap_until (the throttle's clock: the
        # end of a pace a host stated, rule 1), then the share without it.
        self.gap = 0.0
        self.gap_until = math.inf
        self.after = 0.0
        self.next = -math.inf
        self.bad = False  # a data error was logged and the slot went alone
        self.until = -math.inf  # when to try Redis again after it (monotonic)


def run_leases(lease: str, turns: int) -> list[str]:
    """The leases of a run of ``turns`` turns reserved with ``lease``, in order
    (the turn script names them so)."""
    return [lease] + [f"{lease}:{i}" for i in range(2, turns + 1)]


class ServerClock:
    """Redis's clock as this process sees it, so a send goes at its reserved time.

    A turn's wait is counted from when the script ran; its answer reaches the
    process later, by as much as the rest of the pipeline, the transfer and the
    event loop take (tens of milliseconds in a busy crawl). Sleeping the wait
    from the answer would send late, and the next process's send, on time,
    would reach the host early. The offset from Redis's clock to this
    process's is the least ``received - server time`` seen lately (the
    fastest answer); a wait is shortened by how much later than that its
    answer came.
    """

    __slots__ = ("_best", "_previous", "_since")

    def __init__(self) -> None:
        self._best = self._previous = math.inf
        self._since = -math.inf

    def seen(self, server: float, received: float) -> float:
        """An answer stamped ``server`` on Redis's clock came at ``received``:
        return how much later than the fastest answer lately it came."""
        if received - self._since > CLOCK_WINDOW:  # let clock drift in
            self._previous, self._best, self._since = self._best, math.inf, received
        offset = received - server
        self._best = min(self._best, offset)
        return offset - min(self._best, self._previous)

    def wait(self, server: float, wait: float, received: float) -> float:
        return max(0.0, wait - self.seen(server, received))

    def calibrate(self, answers: list[tuple[Any, float]]) -> None:
        """Redis's ``TIME`` answers and when each came: the offset from the
        first moment, before a crawl's first big pipelines (whose answers come
        late) could set it tens of milliseconds wrong."""
        for (seconds, micros), received in answers:
            self.seen(int(seconds) + int(micros) / 1e6, received)


async def within(work: Coroutine[Any, Any, _T], timeout: float) -> _T:  # noqa: ASYNC109
    """``work``'s result, or TimeoutError once Redis took ``timeout`` to answer.

    Only the time this process was running counts: the bound is waited in
    :data:`SLICES` slices, and a slice that took much longer (the process
    had no CPU, or its event loop was busy) counts as one slice. An answer
    that came while the process stood still is read, not taken for a Redis
    too slow to share with (which would send the process alone, above its
    share of the pace). Counted as up to two slices, as it was, a loop busy
    85-150 ms a pass (a fleet crawl's first sends to 200 hosts, new
    connections, on a loaded machine) timed out a pipeline of turns in three
    passes, and every worker went alone.
    """
    loop = asyncio.get_running_loop()
    task = loop.create_task(work)
    step = timeout / SLICES
    spent = 0.0
    try:
        while spent < timeout:
            started = loop.time()
            done, _ = await asyncio.wait((task,), timeout=step)
            if done:
                return task.result()
            spent += min(loop.time() - started, step)
    except BaseException:
        task.cancel()
        raise
    task.cancel()
    raise TimeoutError(f"no answer from Redis within {timeout:g}s")


def deliver(ask: Ask, result: Any) -> bool:
    """Answer an async asker; False if it gave up (cancelled) meanwhile."""
    future: asyncio.Future[Any] = ask.done
    if future.done():
        return False
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
    return True


def channel(prefix: str) -> str:
    """The pub/sub channel on which the prefix's pauses are told (rule 2)."""
    return f"autothrottle:{prefix}:pauses"


def keys(prefix: str, key: str) -> tuple[str, str, str]:
    """The Redis keys of slot ``key``: its hash, its leases, its processes (one hash tag)."""
    tag = f"{{{prefix}:{key}}}"
    return f"{tag}:s", f"{tag}:l", f"{tag}:p"


def merge_args(
    change: Change, ttl: float, channel: str = "", process: str = "", key: str = ""
) -> list[str | int]:
    """The merge script's arguments for a slot's change (rule 5); a pause it sets
    is published on ``channel`` as set by ``process`` for slot ``key`` (rule 2)."""
    state, now = change.state, change.now
    pause = state.pause_until - now if math.isfinite(state.pause_until) else 0.0
    stated, stated_until = state.limits.stated_pace(now)
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
        round(ttl * 1000),
        change.oks,
        "1" if change.strict else "0",
        channel,
        process,
        key,
        us(stated) if stated > 0.0 else "",
        us(stated_until - now) if stated > 0.0 else "",
    ]


def phase(key: str) -> float:
    """The slot's point in its gap, in [0, 1): the same in every process (rule 1)."""
    return zlib.crc32(key.encode()) / 4_294_967_296.0


def us(seconds: float) -> int:
    return round(seconds * 1e6)


def sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
