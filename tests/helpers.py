"""Test helpers shared by the suite: one copy of each (clocks, holds, bounded waits)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import math
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from autothrottle import AutoThrottlePolicy, Lease, Slot, SlotSnapshot, Throttle
from autothrottle._fleet import TurnAsk
from autothrottle._gate import Gate, Ticket
from autothrottle.policy import Sample, SlotConfig
from autothrottle.store import SlotState

if TYPE_CHECKING:  # the redis extra is not every test's
    from autothrottle.redis import RedisStore
    from loopback import LoopbackHost

WALL = 1_700_000_000.0
"""The fake wall clock's epoch seconds when the fake monotonic clock reads 0."""


class FakeClock:
    """A monotonic clock that only moves when told to, with a wall clock beside it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def wall(self) -> float:
        return WALL + self.now


class FakeThrottle:
    """What a timeline reads of a throttle (its snapshots), set by hand."""

    def __init__(self) -> None:
        self.slots: dict[str, SlotSnapshot] = {}

    def set(self, key: str, **values: Any) -> None:
        """Change some of ``key``'s snapshot fields (a new slot starts at delay 1 s)."""
        base = self.slots.get(key) or SlotSnapshot(
            key=key,
            delay=1.0,
            in_flight=0,
            queued=0,
            last_latency=None,
            sent=0,
            responses=0,
            failures=0,
        )
        self.slots[key] = dataclasses.replace(base, **values)

    def snapshot(self) -> Mapping[str, SlotSnapshot]:
        return dict(self.slots)


def refusal_floor(
    refused_gap: float, elapsed: float, *, margin: float = 0.93, time: float = 15.0
) -> float:
    """The least delay ``elapsed`` seconds after a refusal at ``refused_gap``, as
    docs/recovery.md states it: the allowed rate follows
    ``W * (1 + (1 - margin) * (t / time - 1) ** 3)`` up to ``time``, then
    ``W * (1 + (t / time - 1) ** 3)`` (the throttle's defaults).
    """
    phase = elapsed / time - 1.0
    gain = (1.0 - margin) if phase < 0 else 1.0
    return refused_gap / (1.0 + gain * phase**3)


async def take(throttle: Throttle, key: str = "example.com") -> Lease:
    """``await throttle.acquire(key)``, asserting the gate is open now.

    With a fake clock nothing moves time while a request waits, so a closed
    gate would hang; instead the wait is cancelled and the test fails.
    """
    task = asyncio.ensure_future(throttle.acquire(key))
    await asyncio.sleep(0)
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise AssertionError(f"the gate of {key!r} is closed")
    return task.result()


def gate_of(slot: Slot) -> Gate:
    """The engine's gate behind a public slot (tests of the scheduling rules)."""
    return slot._live.gate


def record_of(slot: Slot) -> SlotState:
    """The learned record behind a public slot (the live object, not a copy)."""
    return slot._live.state


class Hold:
    """A request in flight as the gate sees it: the engine's lease without the rules."""

    __slots__ = ("expires_at", "gate", "released", "sent_at", "wire_asked", "wire_gap")

    def __init__(self, slot: Slot, sent_at: float, expires_at: float) -> None:
        self.gate = gate_of(slot)
        self.sent_at = sent_at
        self.expires_at = expires_at
        self.wire_gap = 0.0
        self.wire_asked = -math.inf
        self.released = False

    def expire(self) -> None:
        self.released = True

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.gate.release(self)


def holds(slot: Slot, hold_timeout: float = math.inf) -> Callable[[float], Hold]:
    """A hold factory for the gate of ``slot``, as the throttle's lease factory."""
    return lambda now: Hold(slot, now, now + hold_timeout)


def try_acquire(slot: Slot, ticket: Ticket, hold_timeout: float = math.inf) -> float:
    """``Gate.try_acquire`` with plain holds."""
    return gate_of(slot).try_acquire(ticket, holds(slot, hold_timeout))


def grant_now(slot: Slot, hold_timeout: float = math.inf) -> Hold | None:
    """``Gate.grant_now`` with plain holds."""
    return gate_of(slot).grant_now(holds(slot, hold_timeout))


def abandon(slot: Slot, ticket: Ticket) -> None:
    """Leave the queue as the driver does: release the hold if one was granted."""
    granted = gate_of(slot).abandon(ticket)
    if granted is not None:
        granted.release()  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def bounded(limit: float = 100_000.0) -> AsyncIterator[None]:
    """Fail instead of hanging: a generous limit (fake-time loops make it cheap)."""
    async with asyncio.timeout(limit):
        yield


async def wait_until(condition: Callable[[], Any], within: float = 10.0) -> None:
    """Poll ``condition`` on the real loop until true, failing after ``within`` s."""
    for _ in range(max(1, int(within / 0.005))):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"condition not reached in {within} s")


def reachable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port`` (a Redis server, say)."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5):
        return True
    return False


def needs_redis() -> None:
    """Skip the calling test when no Redis listens on 127.0.0.1:6379, but fail it
    under CI, whose script starts one: a fleet test skipped there tests nothing."""
    if reachable(6379):
        return
    if os.environ.get("CI"):
        pytest.fail("Redis is not running on 127.0.0.1:6379 (.ci/run starts it)")
    pytest.skip("no Redis on 127.0.0.1:6379: start one with `redis-server --daemonize yes`")


CONNECT_KEY = "connect-first"
"""The slot of a Redis store's first turn, taken to connect it (:func:`connected`)."""

_CONNECT_ASK = TurnAsk(0.0, 0.0, 60.0, 8, 300.0, 300.0)  # no gap: no phase point to wait for


async def connected(store: RedisStore) -> RedisStore:
    """``store`` with its first connection made: its scripts loaded, Redis's
    clock mapped, by a turn of a slot no test uses (:data:`CONNECT_KEY`,
    handed back).

    That connection is a one-off of up to 50 round trips (until an answer
    of Redis's clock comes back clean), which a process standing still on a
    loaded machine stretches past a second. A test that times a turn, a
    lease's hold or a pause from before a store's first call measures that
    connection too; connected first, it measures what it is about."""
    turn = await store.take_turn(CONNECT_KEY, _CONNECT_ASK, time.monotonic())
    assert turn.lease is not None, "the store did not reach Redis"
    store.released(CONNECT_KEY, turn.lease)
    return store


def connected_blocking(store: RedisStore) -> RedisStore:
    """:func:`connected` for the sync client (call it in the thread that sends)."""
    turn = store.take_turn_blocking(CONNECT_KEY, _CONNECT_ASK, time.monotonic())
    assert turn.lease is not None, "the store did not reach Redis"
    store.released(CONNECT_KEY, turn.lease)
    return store


_REQUESTS_MADE_BY = ("autothrottle", "httpx", "httpcore", "httpx2", "httpcore2")


def _made_by_a_request(found: object) -> str | None:
    """What an object the collector found is, if the throttle or an httpx
    client made it (a frame or coroutine counts by its code's package)."""
    kind = type(found)
    if kind.__module__.split(".")[0] in _REQUESTS_MADE_BY:
        return f"{kind.__module__}.{kind.__qualname__}"
    code = getattr(found, "f_code", None) or getattr(found, "cr_code", None)
    if code is not None and any(f"/{name}/" in code.co_filename for name in _REQUESTS_MADE_BY):
        return f"{kind.__name__} {code.co_qualname}"
    return None


@contextlib.contextmanager
def left_for_the_collector() -> Iterator[list[str]]:
    """What the block leaves that only the garbage collector can free (objects
    in or behind a reference cycle), of the throttle's and httpx's own: their
    names, filled in as the block ends. Reference counting frees everything
    else at once; a cycle waits for a collection, which in a long crawl is a
    pass over every live object.

    Only what the block made is judged: every object alive as it starts is
    frozen out of the collection (``gc.freeze``). An earlier test's cycle that
    becomes garbage meanwhile (a dropped store whose thread ends now, say) is
    not the block's, and must not be counted against it."""
    gc.collect()
    found: list[str] = []
    gc.disable()
    gc.freeze()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found.extend(sorted(filter(None, map(_made_by_a_request, gc.garbage))))
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.unfreeze()
        gc.enable()
        gc.collect()


class ArrivalSite:
    """A loopback server's record of when each request reached it
    (``time.monotonic()``, one clock for every process on the machine)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.url = ""


@contextlib.asynccontextmanager
async def arrival_site(host: str) -> AsyncIterator[ArrivalSite]:
    """Serve ``GET /`` on the loopback address ``host``, a free port, in the
    running loop, noting each arrival; ``url`` says where."""
    from aiohttp import web  # only the tests that serve need aiohttp

    target = ArrivalSite()

    async def handle(request: web.Request) -> web.Response:
        target.arrivals.append(time.monotonic())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    target.url = f"http://{host}:{runner.addresses[0][1]}/"
    try:
        yield target
    finally:
        await runner.cleanup()


def slot_fields(obj: object, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Every ``__slots__`` attribute of ``obj`` (and its bases) that is set, but
    those in ``skip``: what two paths that must agree are compared by, field for field."""
    out: dict[str, Any] = {}
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name not in skip and name != "__weakref__" and hasattr(obj, name):
                out[name] = getattr(obj, name)
    return out


class Grants:
    """The send times a :class:`~autothrottle.redis.RedisStore`'s answers
    granted, and the turns it handed back as finished, slot by slot: the
    fleet's pace as Redis reserved it.

    A turn's granted time is ``server + waited`` of its answer (``i``
    spacings more for the ``i``-th turn of a run), in seconds on Redis's
    ``TIME``: the wall clock (``time.time()``) of the machine Redis runs on.
    It does not move with a process that reached its turn late (a busy
    event loop, two cores busy, a worker started slowly), where the time a
    request reached the host does. A turn handed back as finished is one
    that was sent (a turn reached late goes back through ``late`` instead;
    a turn voided by a pause through ``released`` too, so a test that
    counts on this has no pause)."""

    def __init__(self, store: RedisStore) -> None:
        from autothrottle._redis_parts import as_text, run_leases

        self.granted: dict[str, float] = {}
        self.slot_of: dict[str, str] = {}
        self.finished: dict[str, list[str]] = {}
        answer, hand_back = store._answer, store.released

        def answered(key: str, ask: TurnAsk, reply: list[Any], *args: Any) -> Any:
            waited, lease, *_, server = (as_text(part) for part in reply[:7])
            if lease:  # a turn, or a run of them a spacing apart
                turns = int(as_text(reply[7])) if len(reply) > 7 else 1
                spacing = float(as_text(reply[8])) if len(reply) > 8 else 0.0
                for i, name in enumerate(run_leases(lease, turns)):
                    self.granted[name] = (float(server) + float(waited) + i * spacing) / 1e6
                    self.slot_of[name] = key
            return answer(key, ask, reply, *args)

        def released(key: str, lease: str) -> None:
            self.finished.setdefault(key, []).append(lease)
            hand_back(key, lease)

        store._answer = answered  # type: ignore[method-assign, assignment]
        store.released = released  # type: ignore[method-assign]

    def sent(self, key: str | None = None) -> list[float]:
        """The granted times of slot ``key``'s turns handed back as finished, in
        order (``None``: every slot's but :data:`CONNECT_KEY`'s)."""
        keys = [key] if key is not None else sorted(self.finished.keys() - {CONNECT_KEY})
        return [self.granted[lease] for k in keys for lease in self.finished.get(k, [])]

    def reserved(self, key: str | None = None) -> list[float]:
        """The granted times of every turn of slot ``key`` Redis reserved, sent
        or not (a turn reached late and handed back too), in order (``None``:
        every slot's but :data:`CONNECT_KEY`'s): the fleet's pace as Redis kept
        it, with none of the holes a process standing still leaves in it."""
        keys = {key} if key is not None else set(self.slot_of.values()) - {CONNECT_KEY}
        return sorted(t for lease, t in self.granted.items() if self.slot_of[lease] in keys)


class SpyPolicy(AutoThrottlePolicy):
    """Scrapy's rules, recording every latency sample the slot received."""

    def __init__(self) -> None:
        self.latencies: list[float] = []

    def next_delay(self, delay: float, sample: Sample, config: SlotConfig) -> float:
        self.latencies.append(sample.latency)
        return super().next_delay(delay, sample, config)


def fixed(delay: float, **kwargs: Any) -> Throttle:
    """A throttle whose every slot keeps ``delay`` whatever it observes."""
    return Throttle(start_delay=delay, min_delay=delay, max_delay=delay, **kwargs)


def wait_for(condition: Any, within: float = 10.0) -> None:
    """Block (a thread's test) until ``condition()`` is true, failing after ``within`` s."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def held(throttle: Throttle, host: LoopbackHost) -> tuple[int, int]:
    """The requests in flight and queued in ``host``'s slot."""
    snapshot = throttle.slot(host.address).snapshot()
    return snapshot.in_flight, snapshot.queued
