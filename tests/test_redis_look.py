"""A request whose late turn was handed back still never goes through the
fleet's pause (the fleet's rules 1 and 2, ``docs/fleet.md``).

A turn reached later than its slack goes back and another is taken, once per
request, so a process late every time still sends. Its second turn, reached
late too (the event loop or the thread stood still on its way to the turn or
to the wire), goes without a third: but not blind. While it stood still
another process may have paused the host (a ``Retry-After``), and only Redis
knows. So it looks: a pause voids it and it waits the pause out, within its
``max_wait``; no pause, it goes. Real Redis on 127.0.0.1:6379 (a prefix per
test), a real loopback server; the stalls are a blocking sleep where the
process would stand still, after the store's answer and at the wire, so
every late turn is late by far more than its slack on any machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import redis

from autothrottle import FixedRatePolicy, Throttle, ThrottleTimeout
from autothrottle._fleet import SharedTurn, TurnAsk
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import ThrottledClient
from autothrottle.redis import RedisStore
from helpers import ArrivalSite as Site
from helpers import arrival_site, connected, connected_blocking, needs_redis
from redis_keys import fresh_prefix

REDIS = "redis://127.0.0.1:6379/0"
KEY = "127.0.0.3"
STALL = 0.3  # how long the process stands still: far past a turn's slack at 10/s
PAUSE = 2.0  # the pause another process sets meanwhile
EARLY = 0.05  # how much earlier than the pause's end we could have placed it here


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    needs_redis()


def site() -> contextlib.AbstractAsyncContextManager[Site]:
    """The host the fleet paces, served in this loop."""
    return arrival_site(KEY)


class Fleet:
    """Our process's store and throttle, and Redis itself, where the rest of
    the fleet's pause is set."""

    def __init__(self) -> None:
        self.name = fresh_prefix()
        self.admin = redis.Redis.from_url(REDIS)
        self.ours = RedisStore(REDIS, prefix=self.name)
        self.throttle = Throttle(policy=FixedRatePolicy(10), store=self.ours)
        self.pause_ends = -1.0  # on time.monotonic's clock; -1: no pause set
        self.asked = 0

    def pause(self) -> None:
        """Another process paused the host for :data:`PAUSE` seconds (its 429's
        ``Retry-After``, merged into Redis)."""
        set_at = time.monotonic()
        seconds, micros = self.admin.time()
        ends = (int(seconds) * 1_000_000 + int(micros)) + round(PAUSE * 1e6)
        self.admin.hset(f"{{{self.name}:{KEY}}}:s", "pause", str(ends))
        self.pause_ends = set_at + PAUSE

    def leases(self) -> int:
        return int(self.admin.zcard(f"{{{self.name}:{KEY}}}:l"))

    def stall_turns(self, monkeypatch: pytest.MonkeyPatch, *plan: Callable[[], None]) -> None:
        """After the store answers its ``i``-th turn, the process runs ``plan[i]``
        (stands still, pauses the host): the turn is then reached late."""
        take, take_blocking = self.ours.take_turn, self.ours.take_turn_blocking

        def after(turn: SharedTurn) -> SharedTurn:
            self.asked += 1
            if self.asked <= len(plan):
                if turn.due is not None:  # to its due (a new slot's phase point), then on
                    time.sleep(max(0.0, turn.due - time.monotonic()))
                plan[self.asked - 1]()
            return turn

        async def stalled(key: str, ask: TurnAsk, now: float, left: float = math.inf) -> SharedTurn:
            return after(await take(key, ask, now, left))

        def stalled_blocking(
            key: str, ask: TurnAsk, now: float, left: float = math.inf
        ) -> SharedTurn:
            return after(take_blocking(key, ask, now, left))

        monkeypatch.setattr(self.ours, "take_turn", stalled)
        monkeypatch.setattr(self.ours, "take_turn_blocking", stalled_blocking)

    async def close(self) -> None:
        await self.ours.aclose()
        self.admin.close()


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    made = Fleet()
    try:
        yield made
    finally:
        await made.close()


def pausing(fleet: Fleet) -> Callable[[], None]:
    """A plan step: another process pauses the host, then this one stands still."""

    def plan() -> None:
        fleet.pause()
        stand_still()

    return plan


def stand_still() -> None:
    time.sleep(STALL)  # the event loop or the thread stands still: nothing else runs


async def sent_stalling_at_connect(fleet: Fleet, at_connect: Callable[[], object]) -> Site:
    """One request through aiohttp whose process runs ``at_connect`` (stands
    still, pauses the host; awaited when it is a coroutine) when its connection
    is ready, on its way to the wire; it must be answered. The site that saw it."""

    async def stalled_connect(*_: Any) -> None:
        done = at_connect()
        if inspect.isawaitable(done):
            await done

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(stalled_connect)
    async with (
        site() as target,
        ThrottledSession(throttle=fleet.throttle, trace_configs=[trace]) as session,
    ):
        async with asyncio.timeout(10.0):
            response = await session.get(target.url)
        assert response.status == 200
    return target


async def test_a_second_turn_reached_late_looks_for_the_fleets_pause(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first turn is reached late and goes back; so is the second, and
    # another process paused the host meanwhile: the request waits the pause out.
    fleet.stall_turns(monkeypatch, stand_still, pausing(fleet))
    with await fleet.throttle.acquire(KEY):
        acquired = time.monotonic()
    assert fleet.pause_ends > 0.0
    assert acquired >= fleet.pause_ends - EARLY, acquired - fleet.pause_ends


async def test_the_bound_holds_when_the_pause_is_longer(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store is connected first: its first connection (past a second on a
    # loaded machine) inside max_wait failed the request before its second
    # turn, the pause never set: a timeout, but not the one this is about.
    await connected(fleet.ours)
    fleet.stall_turns(monkeypatch, stand_still, pausing(fleet))
    started = time.monotonic()
    with pytest.raises(ThrottleTimeout):  # not sent through the pause: past max_wait, raised
        await fleet.throttle.acquire(KEY, max_wait=1.0)
    assert fleet.pause_ends > 0.0, "it failed before the pause"
    assert time.monotonic() - started < 1.0 + STALL * 2  # at once, not at the pause's end
    await fleet.ours.flush()
    assert fleet.leases() == 0  # nothing left reserved


async def test_a_second_turn_late_at_the_wire_looks_for_the_fleets_pause(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first turn is reached late and goes back; the second is on time,
    # but its request stands still on its way to the wire while another
    # process pauses the host.
    fleet.stall_turns(monkeypatch, stand_still)

    target = await sent_stalling_at_connect(fleet, pausing(fleet))
    assert fleet.asked >= 2 and len(target.arrivals) == 1
    assert target.arrivals[0] >= fleet.pause_ends - EARLY, target.arrivals[0] - fleet.pause_ends


async def test_the_sync_client_looks_for_the_fleets_pause_at_the_wire_too(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet.stall_turns(monkeypatch, stand_still)

    def trace(name: str, info: dict[str, Any]) -> None:
        if name == "connection.connect_tcp.complete":
            fleet.pause()
            stand_still()

    def send(url: str) -> int:
        with ThrottledClient(throttle=fleet.throttle) as client:
            return client.get(url, extensions={"trace": trace}).status_code

    async with site() as target:
        status = await asyncio.wait_for(asyncio.to_thread(send, target.url), 10.0)
        assert status == 200
    assert fleet.asked >= 2 and len(target.arrivals) == 1
    assert target.arrivals[0] >= fleet.pause_ends - EARLY, target.arrivals[0] - fleet.pause_ends


async def test_a_process_late_at_every_turn_and_at_the_wire_still_sends(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No pause: a request late everywhere goes after one turn handed back.
    fleet.stall_turns(monkeypatch, stand_still, stand_still, stand_still, stand_still)

    target = await sent_stalling_at_connect(fleet, stand_still)
    assert fleet.asked == 2 and len(target.arrivals) == 1  # one turn back, then it went
    await fleet.ours.flush()
    assert fleet.leases() == 0


async def until(done: Callable[[], bool], what: str, seconds: float = 5.0) -> None:
    """Wait until ``done()``, looking every 2 ms, at most ``seconds``."""
    for _ in range(round(seconds / 0.002)):
        if done():
            return
        await asyncio.sleep(0.002)
    pytest.fail(f"not {what} within {seconds:g} s")


async def listening(store: RedisStore) -> None:
    """Wait until ``store`` hears the fleet's pauses: it subscribes with its first
    reserved turn, on a connection of its own."""
    await until(lambda: store._listener.listening, "listening")


async def another_process_pauses(fleet: Fleet, store: RedisStore) -> None:
    """Another process of the fleet (``store``: its store, connected: a first
    connection here would delay the pause past the time it is counted from)
    pauses the host for :data:`PAUSE` seconds by its own throttle
    (``backoff(pause=)``, a host's ``Retry-After`` alike): its store merges
    the pause into Redis, which tells the fleet."""
    other = Throttle(policy=FixedRatePolicy(2), store=store)
    set_at = time.monotonic()
    other.backoff(KEY, pause=PAUSE)
    await store.flush()
    fleet.pause_ends = set_at + PAUSE


ASK = TurnAsk(0.5, 0.0, 60.0, 8, 300.0, 300.0)
"""A turn as a process at 2/s asks it."""


async def two_turns_reserved_by_others(fleet: Fleet) -> None:
    """Two other processes reserved the next two turns at 2/s: ours, asked for
    next, is due about a second on. Both are connected before the first turn:
    the second's first connection (past a second on a loaded machine) between
    the turns left the first one behind, and ours due at once."""
    async with contextlib.AsyncExitStack() as stack:
        others = [RedisStore(REDIS, prefix=fleet.name) for _ in range(2)]
        for other in others:
            await connected(await stack.enter_async_context(other))
        for other in others:
            turn = await other.take_turn(KEY, ASK, time.monotonic())
            assert turn.lease is not None
            other._runs._runs.clear()  # closing hands back only what it did not take


async def test_a_turn_reserved_before_another_processs_pause_waits_it_out(
    fleet: Fleet,
) -> None:
    # Nothing of ours asks the store for the slot while our turn waits: the
    # pause reaches us on the prefix's channel. Every store is connected
    # first: a first connection (past a second on a loaded machine) made
    # after the others' turns, or before the pause, let our turn come first.
    await connected(fleet.ours)
    pauser = await connected(RedisStore(REDIS, prefix=fleet.name))
    await two_turns_reserved_by_others(fleet)
    fleet.throttle = Throttle(policy=FixedRatePolicy(2), store=fleet.ours)
    waiting = asyncio.create_task(fleet.throttle.acquire(KEY))
    await listening(fleet.ours)
    await until(lambda: fleet.leases() == 3, "reserved")  # waiting for its due
    assert not waiting.done()
    await another_process_pauses(fleet, pauser)
    await pauser.aclose()
    async with asyncio.timeout(10.0):
        lease = await waiting
    acquired = time.monotonic()
    lease.release()
    assert acquired >= fleet.pause_ends - EARLY, acquired - fleet.pause_ends


async def test_a_sync_clients_turn_reserved_before_another_processs_pause_waits_it_out(
    fleet: Fleet,
) -> None:
    # acquire_blocking: the store listens on a thread of its own. Every store
    # is connected first, as in the test above (ours by its sync client).
    await asyncio.to_thread(connected_blocking, fleet.ours)
    pauser = await connected(RedisStore(REDIS, prefix=fleet.name))
    await two_turns_reserved_by_others(fleet)
    fleet.throttle = Throttle(policy=FixedRatePolicy(2), store=fleet.ours)

    def acquire() -> float:
        with fleet.throttle.acquire_blocking(KEY):
            return time.monotonic()

    waiting = asyncio.ensure_future(asyncio.to_thread(acquire))
    await listening(fleet.ours)
    await until(lambda: fleet.leases() == 3, "reserved")  # waiting for its due
    assert not waiting.done()
    await another_process_pauses(fleet, pauser)
    await pauser.aclose()
    async with asyncio.timeout(10.0):
        acquired = await waiting
    assert acquired >= fleet.pause_ends - EARLY, acquired - fleet.pause_ends
    thread = fleet.ours._listener._thread
    assert thread is not None and thread.name == "autothrottle-redis-pauses"
    fleet.ours.close()
    assert not thread.is_alive()  # closing the store ended its listener


async def test_a_request_let_go_before_another_processs_pause_waits_it_out_at_the_wire(
    fleet: Fleet,
) -> None:
    # Its turn came and it was let go; the pause comes while its connection is
    # made: heard at the wire, the turn goes back and a new one is taken after
    # it. The first turn of the host at 1/s leaves 0.1 s of room for a new
    # connection: the pause, set by a process connected already, is heard
    # well within it (sent late, the turn would go back for that instead).
    fleet.throttle = Throttle(policy=FixedRatePolicy(1), store=fleet.ours)
    await connected(fleet.ours)  # our store listens
    await listening(fleet.ours)
    async with RedisStore(REDIS, prefix=fleet.name) as other:
        await connected(other)

        async def paused_at_connect() -> None:
            await another_process_pauses(fleet, other)
            await until(lambda: KEY in fleet.ours._runs._heard, "heard", 2.0)

        target = await sent_stalling_at_connect(fleet, paused_at_connect)
    assert len(target.arrivals) == 1
    assert target.arrivals[0] >= fleet.pause_ends - EARLY, target.arrivals[0] - fleet.pause_ends


async def test_closing_the_store_leaves_no_listener_running(fleet: Fleet) -> None:
    async with site() as target, ThrottledSession(throttle=fleet.throttle) as session:
        assert (await session.get(target.url)).status == 200
    await listening(fleet.ours)
    task = fleet.ours._listener._task
    assert task is not None
    channel = fleet.ours._send.channel
    assert fleet.admin.pubsub_numsub(channel) == [(channel.encode(), 1)]
    await fleet.ours.aclose()
    assert task.done() and not fleet.ours._listener.listening
    subscribed = fleet.admin.pubsub_numsub
    await until(lambda: subscribed(channel) == [(channel.encode(), 0)], "unsubscribed", 1.0)
