"""A live slot's own rules (``autothrottle._slot``), on an injected clock.

What each test pins was left unasserted by the rest of the suite (its mutants
survived, ``docs/mutants.md``): what new settings keep of a live slot, and
when they make its pace strict.
"""

from __future__ import annotations

from autothrottle import AutoThrottlePolicy, FixedRatePolicy, Throttle
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
