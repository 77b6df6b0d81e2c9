"""A pace a host states in its headers is the fleet's (docs/fleet.md, rules 1, 5, 8).

The host says its pace once, in its answers to one process; each process's gate
keeps it from its own answers, and the fleet must keep it for every process,
from the first request of a process that has not heard the host yet. The store
keeps the stated gap and its end (the merge writes it, rule 5; the turn script
floors the fleet's gap by it while it holds, rule 1); a run of turns reserved
before the pace began is void (rule 8). Needs Redis on 127.0.0.1:6379.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import redis
from aiohttp import web

from autothrottle import FixedRatePolicy, Throttle
from autothrottle._fleet import (
    AGAIN,
    FRESH_MOST,
    GO,
    SPACING_MARGIN,
    Fleet,
    Run,
    SharedTurn,
    TurnAsk,
)
from autothrottle._limits import Limits
from autothrottle._redis_parts import LINGER, LINGER_MOST
from autothrottle._state import SlotState
from autothrottle.aiohttp import ThrottledSession
from autothrottle.redis import RedisStore
from helpers import (
    FakeClock,
    Grants,
    connected,
    grant_now,
    needs_redis,
    record_of,
    wait_until,
)
from redis_keys import fresh_prefix

REDIS = "redis://127.0.0.1:6379/0"

QUICK = TurnAsk(0.05, 0.0, 60.0, 8, 300.0, 300.0)
"""The ask of a process that has not heard the host: its own 50 ms gap."""


def _ask(max_pause: float = 300.0) -> TurnAsk:
    return QUICK._replace(max_pause=max_pause)


async def _heard(store: RedisStore, gap: float, holds: float, delay: float = 0.05) -> None:
    """``store``'s process heard the host state one request per ``gap`` seconds,
    for ``holds`` seconds more: its change goes to the fleet (rule 5)."""
    now = time.monotonic()
    state = SlotState(delay, sustained_gap=gap, sustained_until=now + holds)
    store.changed("host", state, now, sent_at=now, backed_off=False, ok=True)
    await store.flush()


Stores = Callable[[int], Awaitable[list[RedisStore]]]
"""Makes ``count`` connected stores of one fresh prefix: the processes of a fleet."""


@pytest.fixture
async def stores() -> AsyncIterator[Stores]:
    """:data:`Stores`, each closed at the test's end, passed or failed (a client
    collected after its loop closed is an error in whichever test runs then)."""
    needs_redis()
    made: list[RedisStore] = []

    async def make(count: int) -> list[RedisStore]:
        name = fresh_prefix()
        fleet = [await connected(RedisStore(REDIS, prefix=name)) for _ in range(count)]
        made.extend(fleet)
        return fleet

    yield make
    for store in made:
        await store.aclose()


async def _granted(stores: list[RedisStore], asks: list[TurnAsk]) -> list[float]:
    """One turn of slot "host" for each store in turn (each its own process,
    none holding a run), and the send times Redis granted them."""
    grants = [Grants(store) for store in stores]
    for store, ask in zip(stores, asks, strict=True):
        turn = await store.take_turn("host", ask, time.monotonic())
        assert turn.lease is not None
        store.released("host", turn.lease)
    return sorted(t for record in grants for t in record.granted.values())


@pytest.fixture
def _redis() -> None:
    needs_redis()


async def test_a_pace_one_process_heard_spaces_the_turns_of_those_that_did_not(
    stores: Stores,
) -> None:
    """The host stated 1 request per 0.5 s to the herald only. Two processes that
    never heard it ask with their own 50 ms gap: Redis spaces their turns by the
    stated pace (with the spacing margin), not 50 ms apart."""
    herald, one, other = await stores(3)
    await _heard(herald, 0.5, 30.0)
    first, second = await _granted([one, other], [QUICK, QUICK])
    assert second - first >= 0.5 * SPACING_MARGIN - 0.001


async def test_a_stated_pace_spaces_the_next_turn_from_the_latest_reserved_at_once(
    stores: Stores,
) -> None:
    """A turn reserved at the fleet's old gap (50 ms) before the host's pace was
    heard: the next turn, asked after the herald's word reached the store, goes
    a stated gap after it, not one old gap after it (the pace from now on)."""
    herald, one, other = await stores(3)
    (first,) = await _granted([one], [QUICK])
    await _heard(herald, 0.5, 30.0)
    (second,) = await _granted([other], [QUICK])
    assert second - first >= 0.5 - 0.001


async def test_the_shared_pace_is_bounded_by_the_askers_max_pause(stores: Stores) -> None:
    """An asker keeps a stated pace at most its own ``max_pause`` long, as its
    gate keeps a header's (``Limits.bound``): one with ``max_pause=0.2`` is
    spaced 0.2 s after the previous turn, not the 0.5 s stated."""
    herald, one, other = await stores(3)
    await _heard(herald, 0.5, 30.0)
    first, second = await _granted([one, other], [QUICK, _ask(max_pause=0.2)])
    # (the room after a process's first turn of a slot, at most FRESH_MOST, besides)
    assert 0.2 - 0.001 <= second - first <= 0.2 + FRESH_MOST + 0.001


async def test_the_shared_pace_ends_when_it_ends_and_only_a_herald_renews_it(
    stores: Stores,
) -> None:
    """The stated pace holds until its end (the window the host stated), then
    the fleet's own gap spaces the turns again; a process that did not hear
    the host (its change states no pace) does not renew it, and an older word
    (an earlier end) does not shorten a later one."""
    herald, one, other = await stores(3)
    admin = redis.Redis.from_url(REDIS)
    key = f"{{{herald.prefix}:host}}:s"
    await _heard(herald, 0.5, 1.0)
    ends = admin.hget(key, "stated_until")
    assert ends is not None
    now = time.monotonic()
    one.changed("host", SlotState(0.05), now, sent_at=now, backed_off=False, ok=True)
    await one.flush()
    assert admin.hget(key, "stated_until") == ends  # not renewed by one who did not hear
    await _heard(herald, 0.5, 0.5)  # an older word, read late: it ends sooner
    assert admin.hget(key, "stated_until") == ends
    await asyncio.sleep(1.2)  # past its end, on Redis's clock too
    first, second = await _granted([one, other], [QUICK, QUICK])
    assert second - first < 0.5 * 0.5  # the fleet's own gap again (50 ms)
    admin.close()


def test_the_gate_and_the_fleet_read_one_home_of_the_stated_spacing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gate's spacing by a stated pace and the fleet's floor are one rule,
    ``Limits.stated_next``: changed there, both follow (no twin of it inline)."""
    calls: list[tuple[float, float, float]] = []

    def stated_next(self: Limits, last: float, now: float, above: float = 0.0) -> float:
        calls.append((last, now, above))
        return last + 7.0

    monkeypatch.setattr(Limits, "stated_next", stated_next, raising=False)
    clock = FakeClock()
    throttle = Throttle(policy=FixedRatePolicy(10), clock=clock)
    slot = throttle.slot("host")
    limits = record_of(slot).limits
    limits.sustained_gap, limits.sustained_until = 0.5, clock() + 60.0
    hold = grant_now(slot)
    assert hold is not None
    hold.release()
    clock.advance(1.0)  # past the stated 0.5 s: the gate waits the 7 s of the one home
    assert grant_now(slot) is None
    assert calls and calls[-1][2] == pytest.approx(0.1)  # above the gate's own gap
    rules: Any = SimpleNamespace(signals=SimpleNamespace(hold_timeout=300.0, max_pause=300.0))
    fleet = Fleet(SimpleNamespace(), rules, clock=clock)
    fake: Any = SimpleNamespace(
        state=SimpleNamespace(delay=0.1, limits=limits),
        config=SimpleNamespace(min_delay=0.0, max_delay=60.0, max_concurrency=8),
    )
    assert fleet.ask(fake).min_gap == pytest.approx(7.0)


@pytest.mark.parametrize(
    ("limits", "now", "pace"),
    [
        (Limits(), 0.0, (0.0, -math.inf)),
        (Limits(sustained_gap=0.2, sustained_until=10.0), 0.0, (0.2, 10.0)),
        (Limits(sustained_gap=0.2, sustained_until=10.0), 10.0, (0.0, -math.inf)),
        # The budget's gap is wider but ends sooner than the policy's: the one
        # that holds the next send longer is shared.
        (Limits(0.0, 1.0, 0.1, 0.2, 10.0), 0.0, (0.2, 10.0)),
        (Limits(0.0, 1.0, 5.0, 0.2, 10.0), 0.0, (1.0, 5.0)),
    ],
)
def test_the_pace_shared_is_the_one_the_gap_is_cut_from(
    limits: Limits, now: float, pace: tuple[float, float]
) -> None:
    assert limits.stated_pace(now) == pace
    gap, until = pace
    left = min(gap, until - now) if gap > 0.0 else 0.0
    assert limits.stated_gap_left(now) == pytest.approx(left)


class _Host:
    """A loopback host that states its pace in every answer (5 a second: 50 in a
    10-s window, as a policy and a budget), answering ``delay`` seconds late, and
    counts the arrivals."""

    POLICY: ClassVar[dict[str, str]] = {
        "RateLimit-Policy": '"default";q=50;w=10',
        "RateLimit": '"default";r=50;t=10',
    }

    def __init__(self, delay: float) -> None:
        self.arrivals: list[float] = []
        self.delay = delay
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.arrivals.append(time.monotonic())
        await asyncio.sleep(self.delay)
        return web.Response(headers=self.POLICY, text="ok")

    def most_in_a_second(self) -> int:
        times = sorted(self.arrivals)
        return max(bisect.bisect_left(times, start + 1.0) - i for i, start in enumerate(times))


@contextlib.asynccontextmanager
async def _serve(host: _Host) -> AsyncIterator[_Host]:
    """Serve ``host`` on 127.0.0.2, a free port (its ``url``)."""
    app = web.Application()
    app.router.add_get("/", host.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.2", 0).start()
    host.url = f"http://127.0.0.2:{runner.addresses[0][1]}/"
    try:
        yield host
    finally:
        await runner.cleanup()


async def _crawl(store: RedisStore, url: str, count: int) -> None:
    """A process's crawl of ``count`` requests at once, at FixedRatePolicy(10):
    twice the pace the host states, which it learns only from its own answers."""
    async with ThrottledSession(throttle=Throttle(policy=FixedRatePolicy(10), store=store)) as s:

        async def one() -> None:
            async with s.get(url) as response:
                assert response.status == 200
                await response.read()

        await asyncio.gather(*(one() for _ in range(count)))


async def test_processes_that_have_not_heard_the_host_keep_its_stated_pace(stores: Stores) -> None:
    """One process heard the host state 5 requests a second. Two more start, each
    with four requests at once at twice that pace; the host answers 0.3 s late,
    so each sends its first requests before its own first answer tells it the
    pace. The host, counting what reaches it, sees no more than 5 in any second:
    the pace it stated once, to one process, is the fleet's from every process's
    first request (before, each sent at its own 0.1 s until it heard: 7-8 in a
    second)."""
    herald, one, other = await stores(3)
    async with _serve(_Host(delay=0.3)) as host:
        await _crawl(herald, host.url, 1)
        await herald.flush()
        await asyncio.gather(_crawl(one, host.url, 4), _crawl(other, host.url, 4))
    assert len(host.arrivals) == 9
    assert host.most_in_a_second() <= 5, sorted(host.arrivals)


def _done_with(
    limits: Limits, turn: SharedTurn, heard: float = 0.0
) -> tuple[int, list[tuple[str, str]]]:
    """What :meth:`Fleet._done` does with ``turn`` when its due came, the host
    having stated ``limits`` to this process (and a gap of ``heard`` seconds to
    another, as the store heard), and what it told the store."""
    told: list[tuple[str, str]] = []
    store: Any = SimpleNamespace(
        late=lambda key, lease: told.append(("late", lease)),
        idle=lambda key: told.append(("idle", key)),
        released=lambda key, lease: told.append(("released", lease)),
        fleet_pause=lambda key, max_pause, now: 0.0,
        fleet_stated=lambda key: heard,
    )
    rules: Any = SimpleNamespace(signals=SimpleNamespace(max_pause=300.0))
    clock = FakeClock()
    fleet = Fleet(store, rules, clock=clock)
    slot: Any = SimpleNamespace(
        key="k", state=SimpleNamespace(pause_until=-math.inf, limits=limits), fleet_went=0.0
    )
    lease: Any = SimpleNamespace(wire_gap=0.3, on_release=None)
    return fleet._done(slot, lease, turn._replace(due=time.monotonic()), False), told


def _run_turn(spacing: float) -> SharedTurn:
    """The second turn of a run of this process's, reserved ``spacing`` apart."""
    return SharedTurn(0.0, "run:2", 0.1, 0.0, None, 1, True, False, math.inf, spacing)


@pytest.mark.parametrize("stated_by", ["sustained", "budget"])
def test_a_run_reserved_before_a_stated_pace_began_is_void(stated_by: str) -> None:
    """A run of turns 0.102 s apart (the fleet's 0.1 s) was reserved before the
    host stated one request per 0.5 s: its turns not yet sent are void (rule 8),
    the rest of the run goes back first (its time too, the latest first), then
    this one, and the request asks again, spaced by the pace."""
    ends = FakeClock()() + 30.0
    limits = (
        Limits(sustained_gap=0.5, sustained_until=ends)
        if stated_by == "sustained"
        else Limits(budget_gap=0.5, budget_until=ends)
    )
    went, told = _done_with(limits, _run_turn(0.1 * SPACING_MARGIN))
    assert went == AGAIN
    assert told == [("idle", "k"), ("late", "run:2")]


def test_a_run_reserved_at_the_stated_pace_or_with_none_stated_goes() -> None:
    ends = FakeClock()() + 30.0
    went, told = _done_with(Limits(), _run_turn(0.1 * SPACING_MARGIN))
    assert (went, told) == (GO, [])
    stated = Limits(sustained_gap=0.5, sustained_until=ends)
    went, told = _done_with(stated, _run_turn(0.5 * SPACING_MARGIN))
    assert (went, told) == (GO, [])
    # A pace about to end keeps a send only what is left of it (stated_gap_left).
    ending = Limits(sustained_gap=0.5, sustained_until=FakeClock()() + 0.05)
    went, told = _done_with(ending, _run_turn(0.1 * SPACING_MARGIN))
    assert (went, told) == (GO, [])


class _Beginning(_Host):
    """A host that states its pace only from its ``after``-th answer on, and
    notes when it first did."""

    def __init__(self, after: int) -> None:
        super().__init__(0.0)
        self.after = after
        self.began = math.inf

    async def handle(self, request: web.Request) -> web.Response:
        self.arrivals.append(time.monotonic())
        if len(self.arrivals) <= self.after:
            return web.Response(text="ok")
        self.began = min(self.began, time.monotonic())
        return web.Response(headers=self.POLICY, text="ok")


async def test_runs_reserved_before_the_host_stated_its_pace_do_not_keep_the_old_spacing(
    stores: Stores,
) -> None:
    """Two processes, twelve requests each at once at FixedRatePolicy(10): each
    takes runs of up to four turns 0.1 s apart. From its ninth answer on the
    host states 5 requests a second. Counted at the host from that answer on,
    no more than 5 reach it in any second: the turns of a run reserved before
    (their requests let through by their gate already) are void, not sent 0.1 s
    apart, nor pushed by the gate into the turns reserved after the run (before:
    6-7 in a second, with two to four sends 0.1 s apart).

    One send of the old spacing may still go: a turn reserved in the moment
    before the answer that began the pace reached the store (``docs/fleet.md``,
    "A stated pace"); on a busy machine that moment is longer. The verdict
    counts the sends closer than the pace allows, not the second they fall in."""
    fleet = await stores(2)
    host = _Beginning(after=8)
    async with _serve(host):
        await asyncio.gather(*(_crawl(store, host.url, 12) for store in fleet))
    assert len(host.arrivals) == 24
    went = sorted(t for t in host.arrivals if t >= host.began)
    close = [b - a for a, b in itertools.pairwise(went) if b - a < 0.15]
    assert len(close) <= 1, went
    host.arrivals = went
    assert host.most_in_a_second() <= 6, went


def test_a_run_is_void_by_a_pace_stated_to_another_process_as_the_store_heard() -> None:
    went, told = _done_with(Limits(), _run_turn(0.1 * SPACING_MARGIN), heard=0.5)
    assert (went, told) == (AGAIN, [("idle", "k"), ("late", "run:2")])


async def test_a_run_reserved_before_another_process_heard_the_pace_goes_back(
    stores: Stores,
) -> None:
    """A process reserved a run of four turns 50 ms apart (its requests came as
    fast as its turns); then another heard the host state one request per 0.5
    s. The merge tells the fleet on the prefix's channel: the run's turns no
    request took go back at once (Redis keeps only the one its asker took), and
    the requests holding its turns find the pace at their due (rule 8)."""
    herald, other = await stores(2)
    run = Run()
    run.length, run._demand = 2, True  # the next ask doubles it: four turns
    other._runs._runs["host"] = run
    turn = await other.take_turn("host", QUICK, time.monotonic())
    assert turn.lease is not None and len(run) == 3
    await wait_until(lambda: other._listener.listening)
    await _heard(herald, 0.5, 30.0)
    await wait_until(lambda: len(run) == 0)
    assert other.fleet_stated("host") == pytest.approx(0.5)
    await other.flush()
    admin = redis.Redis.from_url(REDIS)
    assert admin.zrange(f"{{{other.prefix}:host}}:l", 0, -1) == [turn.lease.encode()]
    admin.close()


def test_an_answer_that_begins_a_stated_pace_is_shared_soon() -> None:
    """Rule 5: the answer that first states a pace (or widens it by more than a
    quarter) is sent to the fleet as soon as a backoff, not after the longest
    linger: the other processes' turns meanwhile keep the old spacing. An
    answer that renews the pace as it was is no news."""
    clock = FakeClock()
    limits = Limits()
    told: list[bool] = []
    stated_by = iter([0.5, 0.5, 0.55, 1.0])

    def observe(slot: Any, **_: Any) -> None:
        limits.sustained_gap, limits.sustained_until = next(stated_by), clock() + 30.0

    rules: Any = SimpleNamespace(observe=observe)
    store: Any = SimpleNamespace(changed=lambda *a, began, **k: told.append(began))
    fleet = Fleet(store, rules, clock=clock)
    slot: Any = SimpleNamespace(
        key="k",
        gate=SimpleNamespace(lock=contextlib.nullcontext()),
        state=SimpleNamespace(backoffs=0, limits=limits),
        config=SimpleNamespace(policy=SimpleNamespace(strict_spacing=False)),
    )
    for _ in range(4):
        fleet.observe(slot, latency=0.01, status=200, headers={}, adjust=True, sent_at=clock())
    assert told == [True, False, False, True]


@pytest.mark.usefixtures("_redis")
async def test_a_change_that_begins_a_stated_pace_lingers_no_longer_than_a_backoff() -> None:
    store = RedisStore(REDIS, prefix=fresh_prefix())  # nothing else waits to go
    now = time.monotonic()
    state = SlotState(0.05, sustained_gap=0.5, sustained_until=now + 30.0)
    store.changed("host", state, now, sent_at=now, backed_off=False, ok=True)
    assert store._send._flush_at >= now + LINGER_MOST  # a success: it may wait for a turn
    store.changed("host", state, now, sent_at=now, backed_off=False, ok=True, began=True)
    assert store._send._flush_at <= time.monotonic() + LINGER
    await store.aclose()
