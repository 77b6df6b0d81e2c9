"""A request's turn past the gate's fast path (``_turns.Turns``) at edges a
mutation run (``scripts/mutants.py _turns``) showed no fast test asserted:
what a wait on a clock that skips waits records and spends, a bound of
nothing, a thread's bound on the real clock, and what the fleet's turn is
handed (the lease, the bound, what is left of it), by a thread and by a task.

The fleet here is a stand-in that records its turns: the Redis tests check the
fleet's own rules; these check what ``Turns`` tells it.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from autothrottle import FixedDelayPolicy, Lease, Throttle, ThrottleTimeout
from autothrottle._slot import LiveSlot
from autothrottle._turns import Turns
from autothrottle.testing import VirtualClock

KEY = "example.com"
TOKENS = {
    "x-ratelimit-limit-tokens": "1000",
    "x-ratelimit-remaining-tokens": "1000",
    "x-ratelimit-reset-tokens": "60s",
}


# -- a thread's wait on a clock that skips waits ----------------------------------------


def test_a_thread_s_wait_on_the_clock_is_recorded_under_its_slot() -> None:
    clock = VirtualClock()
    throttle = Throttle(policy=FixedDelayPolicy(10.0), clock=clock)
    throttle.acquire_blocking(KEY).release()
    throttle.acquire_blocking(KEY).release()
    [wait] = clock.waits
    assert wait.slot == KEY
    assert wait.seconds == pytest.approx(10.0, abs=0.2)
    assert clock.waited(KEY) == wait.seconds


def test_a_thread_waits_on_the_clock_until_its_cost_fits() -> None:
    # 1000 tokens a minute, 600 spent by the first request: the second's 600
    # fit once 200 more came in, 12 s later (docs/signals.md, "Token budgets").
    clock = VirtualClock()
    throttle = Throttle(policy=FixedDelayPolicy(0.0), clock=clock, max_concurrency=10)
    lease = throttle.acquire_blocking(KEY)
    lease.observe(latency=0.01, status=200, headers=TOKENS)
    lease.release()
    first = throttle.acquire_blocking(KEY, cost=600)
    first.release()  # the clock jumps only while nothing is in flight
    second = throttle.acquire_blocking(KEY, cost=600)
    second.release()
    assert second.sent_at - first.sent_at == pytest.approx(12.0, abs=0.2)
    assert clock.skipped > 11.0


async def test_a_task_s_wait_on_the_clock_is_recorded_under_its_slot() -> None:
    clock = VirtualClock()
    throttle = Throttle(policy=FixedDelayPolicy(10.0), clock=clock)
    (await throttle.acquire(KEY)).release()
    (await throttle.acquire(KEY)).release()
    [wait] = clock.waits
    assert wait.slot == KEY
    assert wait.seconds == pytest.approx(10.0, abs=0.2)


async def test_a_task_waits_on_the_clock_until_its_cost_fits() -> None:
    clock = VirtualClock()
    throttle = Throttle(policy=FixedDelayPolicy(0.0), clock=clock, max_concurrency=10)
    lease = await throttle.acquire(KEY)
    lease.observe(latency=0.01, status=200, headers=TOKENS)
    lease.release()
    first = await throttle.acquire(KEY, cost=600)
    first.release()
    second = await throttle.acquire(KEY, cost=600)
    second.release()
    assert second.sent_at - first.sent_at == pytest.approx(12.0, abs=0.2)


def _loop_now() -> float:
    return asyncio.get_running_loop().time()


@pytest.mark.looptime
@pytest.mark.parametrize("max_wait", [None, 30.0])
async def test_a_task_waits_on_the_loop_until_its_cost_fits(max_wait: float | None) -> None:
    # The driver's own wait (no clock that skips: looptime's loop skips it),
    # with a bound or without: the cost waits for its tokens either way.
    throttle = Throttle(policy=FixedDelayPolicy(0.0), clock=_loop_now, max_concurrency=10)
    lease = await throttle.acquire(KEY)
    lease.observe(latency=0.01, status=200, headers=TOKENS)
    lease.release()
    first = await throttle.acquire(KEY, cost=600, max_wait=max_wait)
    second = await throttle.acquire(KEY, cost=600, max_wait=max_wait)
    assert second.sent_at - first.sent_at == pytest.approx(12.0, abs=1e-3)
    first.release()
    second.release()


@pytest.mark.looptime
async def test_a_task_s_bound_on_the_loop_names_its_slot() -> None:
    throttle = Throttle(policy=FixedDelayPolicy(10.0), clock=_loop_now)
    (await throttle.acquire(KEY)).release()
    started = _loop_now()
    with pytest.raises(ThrottleTimeout) as raised:
        await throttle.acquire(KEY, max_wait=3.0)
    assert (raised.value.slot, raised.value.waited) == (KEY, 3.0)
    assert _loop_now() - started == pytest.approx(3.0, abs=1e-3)
    assert throttle.slot(KEY).queued == 0


def test_a_thread_s_bound_of_nothing_waited_nothing() -> None:
    # max_wait=0: the turn now or never; the timeout says it waited 0 s.
    clock = VirtualClock()
    throttle = Throttle(policy=FixedDelayPolicy(10.0), clock=clock)
    throttle.acquire_blocking(KEY).release()
    with pytest.raises(ThrottleTimeout) as raised:
        throttle.acquire_blocking(KEY, max_wait=0.0)
    assert (raised.value.slot, raised.value.waited) == (KEY, 0.0)
    assert throttle.slot(KEY).queued == 0


async def test_a_task_s_bound_of_nothing_waited_nothing() -> None:
    clock = VirtualClock()
    throttle = Throttle(policy=FixedDelayPolicy(10.0), clock=clock)
    (await throttle.acquire(KEY)).release()
    with pytest.raises(ThrottleTimeout) as raised:
        await throttle.acquire(KEY, max_wait=0.0)
    assert (raised.value.slot, raised.value.waited) == (KEY, 0.0)
    assert throttle.slot(KEY).queued == 0


# -- a thread's bound on the real clock -------------------------------------------------


def test_a_thread_s_bound_holds_on_the_real_clock() -> None:
    # Its turn is 5 s away: the bound of a twentieth of a second ends the wait
    # long before (the turn, had it come, would show as a lease, not a timeout).
    throttle = Throttle(policy=FixedDelayPolicy(5.0))
    throttle.acquire_blocking(KEY).release()
    started = time.monotonic()
    with pytest.raises(ThrottleTimeout) as raised:
        throttle.acquire_blocking(KEY, max_wait=0.05)
    assert (raised.value.slot, raised.value.waited) == (KEY, 0.05)
    assert time.monotonic() - started < 4.0
    assert throttle.slot(KEY).queued == 0


# -- what the fleet's turn is handed ----------------------------------------------------


class FleetTurns:
    """A fleet that grants every turn at once and records what it was handed."""

    def __init__(self) -> None:
        self.turns: list[tuple[LiveSlot, Lease, float | None, float]] = []

    async def take_turn(
        self, slot: LiveSlot, lease: Lease, bound: float | None, left: float
    ) -> None:
        self.turns.append((slot, lease, bound, left))

    def take_turn_blocking(
        self, slot: LiveSlot, lease: Lease, bound: float | None, left: float
    ) -> None:
        self.turns.append((slot, lease, bound, left))


def _turns(delay: float, own: float | None) -> tuple[Turns, FleetTurns, LiveSlot]:
    """Turns on the real clock whose fleet is the stand-in, and their slot, whose
    own bound is ``own``."""
    hosts = None if own is None else {KEY: {"max_wait": own}}
    throttle = Throttle(policy=FixedDelayPolicy(delay), hosts=hosts)
    fleet = FleetTurns()
    stand_in: Any = fleet  # what Turns asks of a Fleet: its two turns
    turns = Turns(throttle._rules, stand_in, time.monotonic, throttle)
    return turns, fleet, throttle.slot(KEY)._live


BOUNDS = [(None, None, None), (None, 2.0, 2.0), (5.0, 2.0, 2.0), (0.5, 2.0, 0.5)]
"""The request's bound, its slot's, and the shorter (None: none)."""


@pytest.mark.parametrize(("max_wait", "own", "bound"), BOUNDS)
def test_a_thread_granted_at_once_hands_the_fleet_the_whole_bound(
    max_wait: float | None, own: float | None, bound: float | None
) -> None:
    turns, fleet, live = _turns(1.0, own)
    make = turns.maker(live, True)
    lease = live.gate.grant_now(make)
    assert lease is not None
    assert turns.take_blocking(live, make, None, lease, max_wait) is lease
    assert fleet.turns == [(live, lease, bound, math.inf if bound is None else bound)]
    lease.release()


@pytest.mark.parametrize(("max_wait", "own", "bound"), BOUNDS)
async def test_a_task_granted_at_once_hands_the_fleet_the_whole_bound(
    max_wait: float | None, own: float | None, bound: float | None
) -> None:
    turns, fleet, live = _turns(1.0, own)
    make = turns.maker(live, True)
    lease = live.gate.grant_now(make)
    assert lease is not None
    assert await turns.take(live, make, None, lease, max_wait) is lease
    assert fleet.turns == [(live, lease, bound, math.inf if bound is None else bound)]
    lease.release()


def _left_after_a_wait(fleet: FleetTurns, live: LiveSlot, lease: Lease) -> float:
    """What the fleet was told is left of a 2-s bound after a wait of about 0.1 s."""
    [(slot, handed, bound, left)] = fleet.turns
    assert (slot, handed, bound) == (live, lease, 2.0)
    return left


def test_a_thread_that_waited_hands_the_fleet_what_is_left_of_its_bound() -> None:
    # The gate's wait (a delay of 0.1 s, real time) counts against the bound:
    # the fleet's turn may take only what is left of it.
    turns, fleet, live = _turns(0.1, None)
    make = turns.maker(live, True)
    first = live.gate.grant_now(make)
    assert first is not None
    lease = turns.take_blocking(live, make, None, None, 2.0)
    assert lease is not first
    assert 0.0 < _left_after_a_wait(fleet, live, lease) < 2.0 - 0.05
    first.release()
    lease.release()


async def test_a_task_that_waited_hands_the_fleet_what_is_left_of_its_bound() -> None:
    turns, fleet, live = _turns(0.1, None)
    make = turns.maker(live, True)
    first = live.gate.grant_now(make)
    assert first is not None
    lease = await turns.take(live, make, None, None, 2.0)
    assert lease is not first
    assert 0.0 < _left_after_a_wait(fleet, live, lease) < 2.0 - 0.05
    first.release()
    lease.release()
