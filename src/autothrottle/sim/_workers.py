"""The hosts bound by their workers: the excess waits in a queue, and latency grows.

:class:`Capacity` is an origin of a few workers; :class:`CDN` an edge that
serves most paths itself and sends the rest to such an origin;
:class:`VariableLatency` a backend whose pages are fast or slow. Each shares a
:class:`Pool` of workers with a strict FIFO queue in front of it.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from ._behaviours import Behaviour, Runtime, at_least, count, fraction, positive
from ._pages import Reply, page, share
from ._stats import Recorder, Ticket

__all__ = ["CDN", "Capacity", "Pool", "VariableLatency"]


class Pool:
    """``workers`` workers and a strict FIFO queue in front of them.

    A released worker is handed straight to the oldest waiter, so a newcomer
    can never overtake the queue.
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, workers: int) -> None:
        self._free = workers
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self, tickets: tuple[tuple[Recorder, Ticket], ...]) -> None:
        now = time.monotonic()
        if self._free > 0 and not self._waiters:
            self._free -= 1
            for rec, ticket in tickets:
                rec.begin(ticket, now)
            return
        for rec, ticket in tickets:
            rec.wait(ticket, now)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a worker just as we were cancelled: pass it on
            raise
        now = time.monotonic()
        for rec, ticket in tickets:
            rec.begin(ticket, now)

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1


@dataclass(frozen=True, slots=True)
class Capacity(Behaviour):
    """An origin with ``workers`` workers, each taking ``service_time`` s a request.

    Requests beyond ``workers`` wait in a FIFO queue, so latency grows with
    load the way an overloaded origin's does. Each service time is drawn
    uniformly from ``service_time * [1 - jitter, 1 + jitter]``. True capacity:
    ``workers / service_time`` requests a second.
    """

    workers: int
    service_time: float
    jitter: float = 0.1

    kind: ClassVar[str] = "capacity"

    def __post_init__(self) -> None:
        count("Capacity", "workers", self.workers)
        positive("Capacity", "service_time", self.service_time)
        fraction("Capacity", "jitter", self.jitter, below_one=True)

    @property
    def capacity(self) -> float:
        return self.workers / self.service_time

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        return _CapacityRuntime(self, host, rng)


class _CapacityRuntime(Runtime):
    def __init__(self, b: Capacity, host: str, rng: random.Random) -> None:
        super().__init__(host, rng)
        self.b = b
        self.pool = Pool(b.workers)

    async def serve(self, target: str, ticket: Ticket, rec: Recorder) -> Reply:
        await self.pool.acquire(((rec, ticket),))
        try:
            await asyncio.sleep(self.jittered(self.b.service_time, self.b.jitter))
        finally:
            self.pool.release()
        return Reply(200, page(self.host, target))


@dataclass(frozen=True, slots=True)
class CDN(Behaviour):
    """A CDN edge in front of a slow origin of limited capacity.

    A fixed share ``hit_ratio`` of paths (chosen by a hash of path and query,
    so the same path always hits or always misses) are cache hits served by
    the edge in ``edge_time`` seconds with ``Age``, ``X-Cache: HIT`` and
    ``CF-Cache-Status: HIT``; the rest are misses (``MISS``) served by
    ``origin``, a :class:`Capacity`, with its workers and queue. The origin's
    load is recorded separately. True capacity: the total rate at which the
    misses alone fill the origin, ``origin.capacity / (1 - hit_ratio)``.
    """

    hit_ratio: float = 0.9
    origin: Capacity = Capacity(2, 0.2)
    edge_time: float = 0.005

    kind: ClassVar[str] = "cdn"

    def __post_init__(self) -> None:
        fraction("CDN", "hit_ratio", self.hit_ratio)
        if not isinstance(self.origin, Capacity):
            raise ValueError(f"CDN: origin must be a Capacity, got {self.origin!r}")
        at_least("CDN", "edge_time", self.edge_time, 0.0)

    @property
    def capacity(self) -> float:
        if self.hit_ratio >= 1:
            return math.inf
        return self.origin.capacity / (1.0 - self.hit_ratio)

    def is_hit(self, target: str) -> bool:
        """Whether ``target`` (path and query) is a cache hit on this CDN."""
        return share("cdn-hit", target) < self.hit_ratio

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        return _CDNRuntime(self, host, rng, now)


class _CDNRuntime(Runtime):
    def __init__(self, b: CDN, host: str, rng: random.Random, now: float) -> None:
        super().__init__(host, rng)
        self.b = b
        self.pool = Pool(b.origin.workers)
        self.origin = Recorder(now)
        self.start = now

    async def serve(self, target: str, ticket: Ticket, rec: Recorder) -> Reply:
        b = self.b
        if b.is_hit(target):
            rec.begin(ticket, ticket.arrival)
            await asyncio.sleep(self.jittered(b.edge_time, b.origin.jitter))
            # Each path was cached at its own moment before the server started.
            cached_for = int(share("cdn-age", target) * 3600 + (time.monotonic() - self.start))
            headers = {
                "Age": str(cached_for % 86400),
                "X-Cache": "HIT",
                "CF-Cache-Status": "HIT",
                "Cache-Control": "public, max-age=86400",
            }
            return Reply(200, page(self.host, target), "ok", headers)
        origin = self.origin
        assert origin is not None
        oticket = origin.arrive(time.monotonic())
        try:
            await self.pool.acquire(((rec, ticket), (origin, oticket)))
            try:
                await asyncio.sleep(self.jittered(b.origin.service_time, b.origin.jitter))
            finally:
                self.pool.release()
        except BaseException:
            origin.abort(oticket, time.monotonic())
            raise
        origin.done(oticket, time.monotonic(), 200, "ok")
        headers = {
            "Age": "0",
            "X-Cache": "MISS",
            "CF-Cache-Status": "MISS",
            "Cache-Control": "public, max-age=86400",
        }
        return Reply(200, page(self.host, target), "ok", headers)


@dataclass(frozen=True, slots=True)
class VariableLatency(Behaviour):
    """A backend whose pages are fast or slow, by path.

    A share ``slow_ratio`` of paths (by a hash of path and query) take
    ``slow_time`` seconds, the rest ``fast_time``, each with ``jitter``; all
    share ``workers`` workers and a FIFO queue. True capacity:
    ``workers`` over the mean service time.
    """

    fast_time: float = 0.03
    slow_time: float = 0.5
    slow_ratio: float = 0.2
    workers: int = 4
    jitter: float = 0.1

    kind: ClassVar[str] = "variable"

    def __post_init__(self) -> None:
        at_least("VariableLatency", "fast_time", self.fast_time, 0.0)
        positive("VariableLatency", "slow_time", self.slow_time)
        if self.slow_time < self.fast_time:
            raise ValueError(
                f"VariableLatency: slow_time must be >= fast_time ({self.fast_time!r}), "
                f"got {self.slow_time!r}"
            )
        fraction("VariableLatency", "slow_ratio", self.slow_ratio)
        count("VariableLatency", "workers", self.workers)
        fraction("VariableLatency", "jitter", self.jitter, below_one=True)

    @property
    def mean_service_time(self) -> float:
        """Service time averaged over paths."""
        return self.slow_ratio * self.slow_time + (1.0 - self.slow_ratio) * self.fast_time

    @property
    def capacity(self) -> float:
        mean = self.mean_service_time
        return math.inf if mean == 0 else self.workers / mean

    def is_slow(self, target: str) -> bool:
        """Whether ``target`` (path and query) is one of the slow pages."""
        return share("slow-path", target) < self.slow_ratio

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        return _VariableRuntime(self, host, rng)


class _VariableRuntime(Runtime):
    def __init__(self, b: VariableLatency, host: str, rng: random.Random) -> None:
        super().__init__(host, rng)
        self.b = b
        self.pool = Pool(b.workers)

    async def serve(self, target: str, ticket: Ticket, rec: Recorder) -> Reply:
        b = self.b
        seconds = b.slow_time if b.is_slow(target) else b.fast_time
        await self.pool.acquire(((rec, ticket),))
        try:
            await asyncio.sleep(self.jittered(seconds, b.jitter))
        finally:
            self.pool.release()
        return Reply(200, page(self.host, target))
