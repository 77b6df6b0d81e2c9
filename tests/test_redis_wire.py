"""A fleet turn taken again at the wire keeps the request's ``max_wait`` and the
host's limit together (the fleet's rules 1-3, ``docs/fleet.md``).

A request let go on its turn may reach the wire late (a slow connect, a busy
event loop: here a trace callback of the caller's that sleeps while other
processes reserve the next turns, or pause the host). Its turn then goes back
and another is taken; when that one, or the pause the fleet answers with,
ends later than ``max_wait`` allows, the request fails as a turn past
``max_wait`` does under its client, is not sent, counts no host failure, and
leaves nothing reserved in Redis. Real Redis on 127.0.0.1:6379 (a prefix per
test), real loopback servers.

A request hands one late turn back (the fleet's rule 1, once per request):
one reached late at its turn, past the turn's slack (0.12 s here, the room a
first turn leaves), is taken again there, and its next turn, late at the
wire too, goes off its turn after the store looked for a pause. So:

- ``turns``: the others' turns alone stop the request at the wire only when
  its turn there is its first (a second goes off its turn by design); a
  loaded machine stalls a thread or an event loop past the slack now and
  then (seen at load 13-18), so this case's turn tolerates any lateness
  until the request is on its way to the wire (:meth:`Fleet.crowd` puts the
  tolerance back), and the look at the wire is the library's own;
- ``pause``: the library's own rule throughout: whatever the machine does at
  the turn, the pause stops the request at the wire;
- ``pause-stalled``: the process stands still after the store answered the
  first turn, so that turn always goes back and the request reaches the wire
  on its second turn, where the store's look finds the pause.

The request must reach the wire before its ``max_wait`` ends, or it fails at
its turn and the wire is not tested. Its store is connected before it (a
first connection loads the scripts and maps Redis's clock: up to 50 round
trips on a loaded machine, all counted in ``max_wait``), and ``max_wait``
leaves room (see :data:`MAX_WAIT`). Redis answering slowly is not an outage here (that
is ``test_redis.py``'s): every store waits :data:`TIMEOUT` for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx
import pytest
import redis

from autothrottle import FixedRatePolicy, Throttle, ThrottleTimeout, _fleet
from autothrottle._fleet import SPACING_MARGIN, SharedTurn, TurnAsk
from autothrottle._fleet_turns import LATE_TOLERANCE
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import ThrottledClient
from autothrottle.redis import RedisStore
from helpers import ArrivalSite as Site
from helpers import arrival_site, needs_redis
from redis_keys import fresh_prefix

REDIS = "redis://127.0.0.1:6379/0"
KEY = "127.0.0.2"
GAP = 1.0  # FixedRatePolicy(1): the others' turns are a second apart
LATE = 0.6  # how long the request takes from its turn to the wire: far past its slack
STALL = 0.3  # how long the process stands still after its first turn's answer
MAX_WAIT = 4.0
"""The request's bound. Under what the fleet answers at the wire in every case,
counted from the request's start: the others' four turns after its first one,
or their 5-s pause, end 5 s or more after it, however long reaching the wire
took. Above what reaching the wire takes: the first turn at the slot's phase
point (up to a gap), :data:`STALL`, two round trips. At 2 s, with the store's
first connection inside the bound, a process that stood still a second on the
way failed the request at its turn, before the wire: the pool timeout its test
expects, and a check that found no other process's turn."""
TIMEOUT = 5.0  # each store's Redis timeout: a loaded machine's slow answer is no outage
WARM = "127.0.0.3"  # the slot a store's first turn (its connection) is taken on


_ASK = TurnAsk(GAP, 0.0, 60.0, 8, 300.0, 300.0)
"""What the others (and our store's first turn) ask with."""


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    needs_redis()


def site() -> contextlib.AbstractAsyncContextManager[Site]:
    """The host the fleet paces, served in this loop."""
    return arrival_site(KEY)


class Fleet:
    """The other processes of the fleet (a store each) and a view of Redis."""

    def __init__(self, pause: bool) -> None:
        self.name = fresh_prefix()
        self.pause = pause  # the others pause the host (a Retry-After), or reserve turns
        self.others = [RedisStore(REDIS, prefix=self.name, timeout=TIMEOUT) for _ in range(4)]
        self.admin = redis.Redis.from_url(REDIS)
        self.tat: bytes | None = None
        self.crowded = False  # the request reached the wire
        self.ours = RedisStore(REDIS, prefix=self.name, timeout=TIMEOUT)
        self.throttle = Throttle(policy=FixedRatePolicy(1 / GAP), store=self.ours)

    def stall_first_turn(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The process stands still (nothing else runs) after the store answered
        its first turn, until far past that turn's slack."""
        take, take_blocking = self.ours.take_turn, self.ours.take_turn_blocking
        asked: list[float] = []

        def after(key: str, turn: SharedTurn) -> SharedTurn:
            if key == KEY and not asked:
                asked.append(time.monotonic())
                due = turn.due if turn.due is not None else time.monotonic()
                time.sleep(max(0.0, due - time.monotonic()) + STALL)  # its due, then past it
            return turn

        async def stalled(key: str, ask: TurnAsk, now: float, left: float = math.inf) -> SharedTurn:
            return after(key, await take(key, ask, now, left))

        def stalled_blocking(
            key: str, ask: TurnAsk, now: float, left: float = math.inf
        ) -> SharedTurn:
            return after(key, take_blocking(key, ask, now, left))

        monkeypatch.setattr(self.ours, "take_turn", stalled)
        monkeypatch.setattr(self.ours, "take_turn_blocking", stalled_blocking)

    async def warm(self) -> None:
        """Connect our store before the request: its first turn, of another slot."""
        assert (await self.ours.take_turn(WARM, _ASK, time.monotonic())).lease is not None

    def warm_blocking(self) -> None:
        """:meth:`warm` for the sync client (in the thread that sends)."""
        assert self.ours.take_turn_blocking(WARM, _ASK, time.monotonic()).lease is not None

    def leases(self) -> int:
        return int(self.admin.zcard(f"{{{self.name}:{KEY}}}:l"))

    def next_free(self) -> bytes | None:
        return self.admin.hget(f"{{{self.name}:{KEY}}}:s", "tat")  # type: ignore[return-value]

    async def crowd(self) -> None:
        """While our request is on its way to the wire: the others reserve the
        next four turns, or one of them is told to pause the host 5 s. The
        look at the wire that follows is the library's own again."""
        _fleet.LATE_TOLERANCE = LATE_TOLERANCE  # see the module's docstring
        self.crowded = True
        assert self.leases() == 1  # ours: the request's turn was taken
        if self.pause:
            other = Throttle(policy=FixedRatePolicy(1 / GAP), store=self.others[0])
            other.observe(KEY, latency=0.01, status=429, headers={"Retry-After": "5"})
            await self.others[0].flush()
        else:
            for store in self.others:
                assert (await store.take_turn(KEY, _ASK, time.monotonic())).lease is not None
        self.tat = self.next_free()

    def crowd_blocking(self) -> None:
        asyncio.run(self.crowd_in_new_loop())

    async def crowd_in_new_loop(self) -> None:
        stores = self.others
        self.others = [RedisStore(REDIS, prefix=self.name, timeout=TIMEOUT) for _ in stores]
        try:
            await self.crowd()
        finally:
            for store in self.others:
                await store.aclose()
            self.others = stores

    async def check(self, target: Site) -> None:
        """It failed at the wire: nothing reached the host, no host failure,
        nothing left reserved."""
        assert self.crowded, "the request failed at its turn, before the wire"
        assert target.arrivals == []  # not sent off its turn, nor through the pause
        assert self.throttle.slot(KEY).snapshot().failures == 0
        await self.ours.flush()
        assert self.leases() == (0 if self.pause else 4)  # only the others' turns
        before, now = int(self.tat or 0), int(self.next_free() or 0)
        if self.pause:  # nothing reserved in the pause; our late turn's time came back
            assert now == before - round(GAP * SPACING_MARGIN * 1e6), (now, before)
        else:  # the new turn, after the others', went back with its time
            assert now == before

    async def close(self) -> None:
        for store in [*self.others, self.ours]:
            await store.aclose()
        self.admin.close()


@pytest.fixture(params=["turns", "pause", "pause-stalled"])
async def fleet(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Fleet]:
    if request.param == "turns":
        # The request's turn goes however late this test's thread or loop comes
        # to it (a loaded machine's stall): the look this case checks is the
        # first, at the wire (see the module's docstring).
        monkeypatch.setattr(_fleet, "LATE_TOLERANCE", math.inf)
    made = Fleet(pause=request.param != "turns")
    if request.param == "pause-stalled":
        made.stall_first_turn(monkeypatch)
    try:
        yield made
    finally:  # every client closed while the loop runs
        await made.close()


async def test_aiohttp_fails_at_the_wire_as_past_max_wait(fleet: Fleet) -> None:
    async def slow_connect(session: Any, ctx: SimpleNamespace, params: Any) -> None:
        await fleet.crowd()
        await asyncio.sleep(LATE)

    await fleet.warm()
    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(slow_connect)
    async with (
        site() as target,
        ThrottledSession(throttle=fleet.throttle, trace_configs=[trace]) as session,
    ):
        with pytest.raises(ThrottleTimeout) as raised:
            await asyncio.wait_for(
                session.get(target.url, trace_request_ctx={"autothrottle": {"max_wait": MAX_WAIT}}),
                30.0,
            )
        assert not isinstance(raised.value, aiohttp.ClientError)  # not a connection timeout
        await fleet.check(target)


def _slow_trace(crowd: Callable[[], Any]) -> Any:
    async def trace(name: str, info: dict[str, Any]) -> None:
        if name == "connection.connect_tcp.complete":
            await crowd()
            await asyncio.sleep(LATE)

    return trace


@pytest.mark.parametrize("package", ["httpx", "httpx2"])
async def test_httpx_fails_at_the_wire_with_its_pool_timeout(fleet: Fleet, package: str) -> None:
    http = pytest.importorskip(package)
    adapter = importlib.import_module(f"autothrottle.{package}")
    await fleet.warm()
    async with site() as target, adapter.AsyncThrottledClient(throttle=fleet.throttle) as client:
        with pytest.raises(http.PoolTimeout) as raised:
            await asyncio.wait_for(
                client.get(
                    target.url,
                    extensions={
                        "autothrottle": {"max_wait": MAX_WAIT},
                        "trace": _slow_trace(fleet.crowd),
                    },
                ),
                30.0,
            )
        assert isinstance(raised.value, ThrottleTimeout)
        await fleet.check(target)


async def test_the_sync_httpx_client_fails_at_the_wire_with_its_pool_timeout(
    fleet: Fleet,
) -> None:
    def trace(name: str, info: dict[str, Any]) -> None:
        if name == "connection.connect_tcp.complete":
            fleet.crowd_blocking()
            time.sleep(LATE)

    errors: list[BaseException] = []

    def send(url: str) -> None:
        fleet.warm_blocking()
        with ThrottledClient(throttle=fleet.throttle) as client:
            try:
                client.get(url, extensions={"autothrottle": {"max_wait": MAX_WAIT}, "trace": trace})
            except BaseException as error:
                errors.append(error)

    async with site() as target:
        await asyncio.wait_for(asyncio.to_thread(send, target.url), 30.0)
        assert len(errors) == 1 and isinstance(errors[0], httpx.PoolTimeout), errors
        assert isinstance(errors[0], ThrottleTimeout)
        fleet.ours.flush_blocking()
        await fleet.check(target)


async def test_requests_fails_at_the_wire_with_its_wait_timeout(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    import requests
    import urllib3.connection

    from autothrottle.requests import ThrottledSession as RequestsSession
    from autothrottle.requests import ThrottleWaitTimeout

    connect = urllib3.connection.HTTPConnection.connect

    def slow_connect(self: Any) -> None:
        connect(self)
        fleet.crowd_blocking()
        time.sleep(LATE)

    monkeypatch.setattr(urllib3.connection.HTTPConnection, "connect", slow_connect)
    errors: list[BaseException] = []

    def send(url: str) -> None:
        fleet.warm_blocking()
        with RequestsSession(throttle=fleet.throttle) as session:
            try:
                session.get(url, autothrottle={"max_wait": MAX_WAIT})
            except BaseException as error:
                errors.append(error)

    async with site() as target:
        await asyncio.wait_for(asyncio.to_thread(send, target.url), 30.0)
        assert len(errors) == 1 and isinstance(errors[0], ThrottleWaitTimeout), errors
        assert isinstance(errors[0], requests.Timeout)
        fleet.ours.flush_blocking()
        await fleet.check(target)
