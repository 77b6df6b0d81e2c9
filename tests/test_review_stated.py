"""A pace a host stated, as a process keeps it alone while Redis does not answer
(docs/fleet.md, rules 1, 5 and 6).

A process that asked Redis for a turn keeps its share of the fleet's last pace
(the gap Redis would reserve with, times the processes sharing the slot), to
pace alone when Redis stops answering. A pace the host stated to another
process floors that gap in Redis while it holds: the share kept must be the
floored gap when Redis answered with the cap or a pause too, and the fleet's
own once that pace has ended, as the fleet's turns are. Needs Redis on
127.0.0.1:6379; the alone turns are asked at given times (no sleeps).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
import redis

from autothrottle import FixedRatePolicy, Throttle
from autothrottle._fleet import AGAIN, Run
from autothrottle._limits import Limits
from autothrottle._state import SlotState
from autothrottle.aiohttp import ThrottledSession
from autothrottle.redis import RedisStore
from helpers import Grants, wait_until
from test_fleet_stated import (
    QUICK,
    REDIS,
    Stores,
    _Beginning,
    _done_with,
    _heard,
    _redis,
    _serve,
    stores,
)
from test_redis_rules import GAP_US, Slot

__all__ = ["_redis", "stores"]

STATED = 0.5
"""The herald heard the host state one request per half second."""


def _alone_gap(store: RedisStore, now: float) -> float:
    """The spacing ``store``'s process keeps alone for the slot between two
    turns it goes alone at ``now`` and just after (rule 6)."""
    first = store._outage.alone_turn("host", QUICK, now)
    assert (first.lease, first.wait) == (None, 0.0)  # alone: it goes
    second = store._outage.alone_turn("host", QUICK, now + 0.001)
    assert second.lease is None
    return second.wait + 0.001


async def test_a_process_answered_with_the_cap_keeps_the_stated_pace_alone(
    stores: Stores,
) -> None:
    """The process heard of the pace only in Redis's answer of the cap (another
    holds the slot's one lease): alone, it keeps its share of the stated pace,
    not of its own 50 ms gap."""
    herald, holder, one = await stores(3)
    await _heard(herald, STATED, 30.0)
    single = QUICK._replace(cap=1)
    held = await holder.take_turn("host", single, time.monotonic())
    assert held.lease is not None
    refused = await one.take_turn("host", single, time.monotonic())
    assert refused.lease is None  # the cap: ask again
    gap = _alone_gap(one, time.monotonic())
    assert gap >= STATED * QUICK.margin * 2 - 0.001  # two processes share the slot
    holder.released("host", held.lease)


async def test_alone_a_process_goes_back_to_the_fleets_pace_when_the_stated_one_ends(
    stores: Stores,
) -> None:
    """The stated pace holds 0.3 s more: alone past its end, the process keeps
    its share of the fleet's own gap, as Redis spaces the turns then; within
    it, the stated pace's."""
    herald, one = await stores(2)
    await _heard(herald, STATED, 0.3)
    now = time.monotonic()
    turn = await one.take_turn("host", QUICK, now)
    assert turn.lease is not None
    one.released("host", turn.lease)
    within = _alone_gap(one, now + 0.01)
    assert within >= 0.2  # the stated gap, cut to what was left of it
    after = _alone_gap(one, now + 5.0)
    assert after <= QUICK.gap * QUICK.margin + 0.002  # one process: its own 50 ms gap


@pytest.mark.parametrize("after", [0.0, 0.12, 0.3])
async def test_requests_cancelled_as_their_run_is_void_hold_nothing(
    stores: Stores, after: float
) -> None:
    """Eight requests of a process at once, its first ask reserving a run of
    four turns 0.1 s apart; once the host has answered one, another process
    hears the host state one request per 0.5 s, and this one hears of it on
    the channel: its run is void (rule 8), its untaken turns go back. The
    requests are cancelled ``after`` seconds later (as the turns go back, as
    they ask again, as they wait for the new turns). Nothing is held: no
    request in flight or queued in the process, and no lease of the slot left
    in Redis once the process's messages are sent (a turn voided and not
    handed back would hold a place under the cap until ``hold_timeout``)."""
    herald, one = await stores(2)
    throttle = Throttle(policy=FixedRatePolicy(10), store=one)
    async with _serve(_Beginning(after=10**6)) as host, ThrottledSession(throttle=throttle) as s:

        async def request() -> None:
            async with s.get(host.url) as response:
                await response.read()

        run = Run()
        run.length, run._demand = 2, True  # its first ask reserves four turns
        one._runs._runs["127.0.0.2"] = run
        tasks = [asyncio.create_task(request()) for _ in range(8)]
        await wait_until(lambda: len(host.arrivals) >= 1)
        now = time.monotonic()
        state = SlotState(0.1, sustained_gap=STATED, sustained_until=now + 30.0)
        herald.changed("127.0.0.2", state, now, sent_at=now, backed_off=False, ok=True)
        await herald.flush()
        await wait_until(lambda: one.fleet_stated("127.0.0.2") > 0.0)  # heard: the run is void
        await asyncio.sleep(after)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        (row,) = throttle.stats().slots
        key = row.key
        snapshot = throttle.slot(key).snapshot()
        assert (snapshot.in_flight, snapshot.queued) == (0, 0)
        await one.flush()
    admin = redis.Redis.from_url(REDIS)
    try:
        assert admin.zcard(f"{{{one.prefix}:{key}}}:l") == 0
    finally:
        admin.close()


def _merged(slot: Slot, *paces: tuple[int, int]) -> tuple[float, float]:
    """The stated gap Redis keeps after ``paces`` (gap, µs it holds from now)
    were merged in turn, each by a process that heard it, and how long it holds."""
    for pace in paces:
        slot.merge(delay_us=GAP_US, backed_off=False, oks=1, stated=pace)
    return slot.field("stated"), slot.field("stated_until")


def test_a_budgets_gap_wider_than_the_policys_pace_is_kept(_redis: None) -> None:
    """A host states its policy (50 in 10 s: 0.2 s, holding the window) and its
    budget, spent further than that pace (5 left for 5 s: 0.8 s until the
    reset): the fleet keeps the budget's gap until its reset, though the
    policy's pace ends later (the later end won: the processes that had not
    heard the budget spent it at 0.2 s)."""
    server = redis.Redis.from_url(REDIS)
    try:
        slot = Slot(server)
        gap, _ = _merged(slot, (200_000, 10_000_000), (800_000, 5_000_000))
        assert gap == 800_000
        first = slot.turn("a")
        assert Slot.at(slot.turn("b")) - Slot.at(first) == 800_000
    finally:
        server.close()


def test_a_budget_spent_further_in_its_window_is_kept_though_its_reset_rounds_earlier(
    _redis: None,
) -> None:
    """Two answers of one budget window: the later says a wider gap (spent
    further), and its reset, rounded to the second by the server, ends 0.4 s
    before the first's. The wider is kept; a narrower pace ending later waits
    until the wider ends."""
    server = redis.Redis.from_url(REDIS)
    try:
        slot = Slot(server)
        assert _merged(slot, (500_000, 10_000_000), (800_000, 9_600_000))[0] == 800_000
        assert _merged(slot, (300_000, 20_000_000))[0] == 800_000  # still 0.8 s left of it
        ended = Slot(server)
        _merged(ended, (800_000, 1_000))
        time.sleep(0.01)  # past its end on Redis's clock
        assert _merged(ended, (300_000, 20_000_000))[0] == 300_000
    finally:
        server.close()


async def test_a_looks_answer_keeps_the_share_the_last_turn_said(stores: Stores) -> None:
    """A turn's answer said the stated pace (0.5 s); then a look at that turn,
    reached late, finds another process's pause. The look's answer says no
    gap: alone, the process keeps the share of the stated pace, not of its
    own 50 ms gap."""
    herald, one = await stores(2)
    await _heard(herald, STATED, 30.0)
    turn = await one.take_turn("host", QUICK, time.monotonic())
    assert turn.lease is not None
    now = time.monotonic()
    herald.changed(
        "host", SlotState(0.05, pause_until=now + 5.0), now, sent_at=now, backed_off=True
    )
    await herald.flush()
    looked = await one.look("host", turn.lease, QUICK, time.monotonic())
    assert looked.lease is None and looked.pause > 0.0  # the pause: ask again
    assert _alone_gap(one, time.monotonic()) >= STATED * QUICK.margin - 0.001
    one.released("host", turn.lease)


def test_a_slot_kept_by_an_older_version_takes_turns_and_merges(_redis: None) -> None:
    """A rolling upgrade: the slot's hash has only the fields an older version
    wrote (no stated pace). The turn script reads none held, spaces by the
    fleet's delay and says no stated pace; the merge adds one."""
    server = redis.Redis.from_url(REDIS)
    try:
        slot = Slot(server)
        server.hset(slot.state, mapping={"delay": GAP_US, "pause": 0, "version": 3})
        first = slot.turn("a")
        second = slot.turn("b")
        assert Slot.at(second) - Slot.at(first) == GAP_US
        assert (int(second[10]), int(second[11])) == (GAP_US, 0)  # no stated pace
        assert _merged(slot, (800_000, 5_000_000))[0] == 800_000
    finally:
        server.close()


async def test_a_pace_told_while_a_run_is_reserved_voids_that_run(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis reserved a run of four turns 50 ms apart; the pace another process
    heard (one request per 0.5 s) is told on the channel before this process
    records Redis's answer. The message finds the slot's run (made as the
    slot's first request asked, before any answer), so the pace is kept though
    the run's turns came after it: the run's next turn, at its due, is void
    (rule 8), as one reserved before a pace heard later."""
    (other,) = await stores(1)
    first = await other.take_turn("host", QUICK, time.monotonic())
    assert first.lease is not None
    other.released("host", first.lease)
    run = other._runs.get("host")
    assert run is not None
    run.length, run._demand = 2, True  # the next ask doubles it: four turns
    answer = other._answer

    def told_meanwhile(*args: Any) -> Any:
        other._runs.stated("host", STATED, time.monotonic() + 30.0)  # the listener's call
        return answer(*args)

    monkeypatch.setattr(other, "_answer", told_meanwhile)
    turn = await other.take_turn("host", QUICK, time.monotonic())
    monkeypatch.setattr(other, "_answer", answer)
    assert turn.lease is not None and len(run) == 3  # recorded after the message
    assert other.fleet_stated("host") == pytest.approx(STATED)  # kept all the same
    other.released("host", turn.lease)
    second = await other.take_turn("host", QUICK, time.monotonic())
    assert second.joined and second.lease is not None
    went, told = _done_with(Limits(), second, heard=other.fleet_stated("host"))
    assert went == AGAIN and told[-1] == ("late", second.lease)
    other.idle("host")
    other.late("host", second.lease)


async def test_a_pace_told_to_a_process_with_no_run_of_the_slot_needs_none(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process listening on the channel that never took a turn of the slot
    drops the pace told of it (``Runs.stated`` keeps paces for the slots it
    takes turns of): it has no turn to void, and the turns it reserves after
    the message were reserved after the merge that told it, which Redis
    spaces by the pace. Its requests, as fast as a run, get turns the stated
    gap apart from the first (before the merge: the fleet's 50 ms)."""
    herald, other = await stores(2)
    await wait_until(lambda: other._listener.listening)
    told: list[str] = []
    stated = other._listener._stated
    assert stated is not None

    def heard(key: str, gap: float, until: float, merged: float) -> None:
        told.append(key)
        stated(key, gap, until, merged)

    monkeypatch.setattr(other._listener, "_stated", heard)
    await _heard(herald, STATED, 30.0)
    await wait_until(lambda: told == ["host"])  # the message came
    assert other.fleet_stated("host") == 0.0  # and went
    grants = Grants(other)
    for _ in range(3):  # as a run would serve them, at the fleet's old 50 ms
        for _ in range(20):
            turn = await other.take_turn("host", QUICK, time.monotonic())
            if turn.lease is not None:
                other.released("host", turn.lease)
                break
            await asyncio.sleep(turn.wait)  # its last reserved turn is not due yet
    times = grants.sent("host")  # a turn a busy loop reached late went back: not these
    assert len(times) == 3
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= STATED - 0.001, gaps  # the stated gap (a run's turns: no margin)


async def test_a_run_spaced_by_what_is_left_of_a_pace_is_not_void_when_told_of_it(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host told another process its budget's last request: one more in the
    0.6 s left (a gap of 0.6 s, ending in 0.6 s). Redis spaces a run reserved
    after that by what is left of the pace, under 0.6 s, as the gate does; the
    channel's message, heard after the run was recorded, names the whole gap.
    The run is spaced as the pace asks: it stays, its turns not handed back
    (they were, the run taken for one reserved before the pace: a round trip
    each for its requests, and their places lost)."""
    herald, other = await stores(2)
    await wait_until(lambda: other._listener.listening)
    first = await other.take_turn("host", QUICK, time.monotonic())
    assert first.lease is not None
    other.released("host", first.lease)
    run = other._runs.get("host")
    assert run is not None
    run.length, run._demand = 2, True  # the next ask doubles it: four turns
    held: list[tuple[str, float, float, float]] = []
    stated = other._listener._stated
    assert stated is not None
    monkeypatch.setattr(other._listener, "_stated", lambda *told: held.append(told))
    await _heard(herald, 0.6, 0.6)
    await wait_until(lambda: len(held) == 1)  # told; it reaches the runs after the ask
    await asyncio.sleep(0.05)  # well inside the pace, past its first instant
    turn = await other.take_turn("host", QUICK, time.monotonic())
    assert turn.lease is not None and len(run) == 3
    assert run.spacing < 0.6 * QUICK.margin  # what is left of the pace, not all of it
    stated(*held[0])
    assert len(run) == 3  # not void
    other.released("host", turn.lease)
    other.idle("host")
