"""A live slot's own rules (``autothrottle._slot``), on an injected clock.

What each test pins was left unasserted by the rest of the suite (its mutants
survived, ``docs/mutants.md``): what new settings keep of a live slot, and
when they make its pace strict; on a lease's usual answer, that only a plain
200 lowers the delay, that a refusal ends the ramp-up, and that a fall the
ramp holds nothing of leaves no ramp.
"""

from __future__ import annotations

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, AutoThrottlePolicy, FixedRatePolicy, Throttle
from helpers import FakeClock, gate_of, record_of, take

KEY = "example.com"


def test_new_settings_keep_a_live_slots_policy_with_its_burst_and_windows() -> None:
    """A live slot keeps its policy under new settings (what it learned is that
    policy's), and with it the burst and windows that policy set."""
    old = FixedRatePolicy(2.0, burst=3, windows=[(10, 60.0)])
    throttle = Throttle(clock=FakeClock(), policy=old)
    slot = throttle.slot(KEY)
    throttle.set_host(KEY, {"policy": FixedRatePolicy(5.0), "max_delay": 30.0})
    assert slot.config.policy is old
    assert (slot.config.burst, slot.config.windows) == (3, ((10, 60.0),))
    assert slot.config.max_delay == 30.0


async def test_new_settings_with_a_min_delay_make_the_pace_strict_and_without_not() -> None:
    """A ``min_delay`` set on a live slot (any above 0, under a second too) makes
    its pace strict: its next answer starts the arrival guard; settings without
    one leave a latency policy's pace as it was, with no guard."""
    for min_delay, strict in ((0.5, True), (0.0, False)):
        clock = FakeClock()
        throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=0.0)
        slot = throttle.slot(KEY)
        throttle.set_host(KEY, {"min_delay": min_delay})
        clock.advance(1.0)
        lease = await take(throttle)
        lease.observe(latency=0.1, status=200)
        lease.release()
        assert (gate_of(slot).arrivals is not None) is strict, min_delay


async def test_an_answer_while_a_stated_pace_holds_reaches_the_arrival_guard() -> None:
    """A pace the host stated makes a latency policy's pace strict while it holds:
    the usual answer then starts the arrival guard (a budget need not hold too)."""
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=0.0)
    slot = throttle.slot(KEY)
    record_of(slot).limits.sustained_until = clock.now + 10.0
    lease = await take(throttle)
    lease.observe(latency=0.1, status=200)
    lease.release()
    assert gate_of(slot).arrivals is not None


@pytest.mark.parametrize("status", [201, 302])
async def test_an_answer_other_than_a_plain_200_never_lowers_the_delay(status: int) -> None:
    """Only a plain 200 may lower the delay (docs/signals.md): a quick 201 or
    302, though usual, keeps it where it was; the 200 after it lowers it."""
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=2.0)
    slot = throttle.slot(KEY)
    lease = await take(throttle)
    lease.observe(latency=0.01, status=status)
    lease.release()
    assert slot.delay == 2.0
    clock.advance(2.0)
    lease = await take(throttle)
    lease.observe(latency=0.01, status=200)
    lease.release()
    assert slot.delay < 2.0


@pytest.mark.parametrize("refused", [False, True])
async def test_after_a_refusal_the_ramp_no_longer_holds_an_answers_delay(refused: bool) -> None:
    """The ramp bounds how fast a slot never refused speeds up; once refused
    (here at a gap well under a second) the recovery floor bounds it instead,
    on a lease's usual answer as on the rules' (tests/test_rules_edges.py)."""
    clock = FakeClock()
    policy = AdaptiveConcurrencyPolicy(initial_limit=4.0)
    throttle = Throttle(clock=clock, start_delay=0.2, policy=policy)
    slot = throttle.slot(KEY)
    throttle.observe(KEY, latency=0.05, status=200)
    if refused:
        throttle.observe(KEY, latency=0.05, status=429)
        assert 0.0 < record_of(slot).refused_gap <= 1.0
    clock.advance(60.0)  # the recovery floor is far below by now
    slot.delay = 0.0
    first, second = await take(throttle), await take(throttle)
    first.observe(latency=0.01, status=200)  # the ramp counts from here
    first.release()
    slot.delay = 2.0
    clock.advance(0.01)
    second.observe(latency=0.01, status=200)
    second.release()
    if refused:
        assert slot.delay < 0.01  # what the policy asked for: a latency of 10 ms shared
    else:  # halving at most each second, from 2 s
        assert slot.delay == pytest.approx(2.0 * 2.0 ** (-0.01), rel=1e-3)


def test_a_falling_delay_the_ramp_holds_nothing_of_leaves_no_ramp() -> None:
    """Long after the delay was last adapted the ramp allows any fall: the delay
    the policy asks for (3.25 s) is taken whole and nothing is left to fall
    toward; the next gap keeps all of it."""

    class Ramping(AutoThrottlePolicy):
        ramp_up = 1.0

    clock = FakeClock()
    throttle = Throttle(policy=Ramping(), start_delay=4.0, clock=clock)
    slot = throttle.slot(KEY)
    clock.advance(100.0)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.observe(latency=2.5, status=200)  # asks for (4 + 2.5) / 2
    lease.release()
    assert slot.delay == 3.25
    clock.advance(3.2)  # a ramp toward anything below 3.25 s would let one go by now
    assert throttle.try_acquire(KEY) is None
    clock.advance(0.05)
    assert throttle.try_acquire(KEY) is not None


async def test_once_begun_the_arrival_guard_counts_every_answer() -> None:
    """The guard a stated pace began stays with the slot, and the wire counts
    each gap from it (``WireTurn.counts_from``): an answer after that pace
    ended still counts, or the next stated pace would start from a least
    latency the path no longer has."""
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=AutoThrottlePolicy(), start_delay=0.0)
    slot = throttle.slot(KEY)
    record_of(slot).limits.sustained_until = clock.now + 10.0
    lease = await take(throttle)
    lease.observe(latency=0.1, status=200)
    lease.release()
    guard = gate_of(slot).arrivals
    assert guard is not None
    assert guard.least_latency() == 0.1
    clock.advance(20.0)  # the stated pace ended
    lease = await take(throttle)
    lease.observe(latency=0.05, status=200)
    lease.release()
    assert gate_of(slot).arrivals is guard
    assert guard.least_latency() == 0.05


async def test_a_slots_repr_shows_its_key_delay_and_counts() -> None:
    throttle = Throttle(clock=FakeClock(), policy=AutoThrottlePolicy(), start_delay=2.0)
    lease = await take(throttle)
    assert repr(throttle.slot(KEY)) == "<Slot 'example.com' delay=2.000s in_flight=1 queued=0>"
    lease.release()
