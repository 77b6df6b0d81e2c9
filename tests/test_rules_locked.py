"""The rules run under the slot's lock (``Rules.fail``, ``backoff``, ``pause``,
``adopt``) at edges a mutation run (``scripts/mutants.py _rules``, which
applies the lock's decorator after the class so that mutmut mutates them)
showed no fast test asserted, on a hand-set clock (docs/signals.md,
docs/fleet.md).

``adopt`` is the fleet's way in (what a shared store learned): the Redis
tests reach it through a store; here it is called as the fleet calls it.
"""

from __future__ import annotations

import logging
import math

import pytest

from autothrottle import Throttle, ThrottleEvent
from autothrottle._rules import Rules
from autothrottle._slot import LiveSlot
from helpers import FakeClock, gate_of, record_of, try_acquire

KEY = "example.com"


def _rules(throttle: Throttle) -> tuple[Rules, LiveSlot]:
    """The throttle's rules and the live slot they change (as a fleet holds them)."""
    return throttle._rules, throttle.slot(KEY)._live


class Woken:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


# -- adopt: what the fleet learned ------------------------------------------------------


def test_an_adopted_delay_is_clamped_to_the_slot_s_bounds_and_wakes_the_head() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=1.0, min_delay=0.5, max_delay=10.0)
    rules, live = _rules(throttle)
    slot = throttle.slot(KEY)
    first = throttle.try_acquire(KEY)
    assert first is not None
    ticket = gate_of(slot).enqueue()
    assert try_acquire(slot, ticket) > 0.0
    ticket.wake = woken = Woken()
    # Nothing learned (no delay, no pause): nothing changes, nobody re-checks.
    rules.adopt(live, None, 0.0, clock())
    rules.adopt(live, 1.0, 0.0, clock())  # the delay the slot has
    assert (slot.delay, slot.pause_until, woken.count) == (1.0, -math.inf, 0)
    rules.adopt(live, 60.0, 0.0, clock())
    assert slot.delay == 10.0
    assert woken.count == 1
    rules.adopt(live, 0.1, 0.0, clock())
    assert slot.delay == 0.5
    assert woken.count == 2
    assert slot.pause_until == -math.inf
    first.release()


@pytest.mark.parametrize("pause", [0.25, 3.0])
def test_an_adopted_pause_runs_from_now_and_wakes_the_head(pause: float) -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=1.0)
    rules, live = _rules(throttle)
    slot = throttle.slot(KEY)
    first = throttle.try_acquire(KEY)
    assert first is not None
    ticket = gate_of(slot).enqueue()
    assert try_acquire(slot, ticket) > 0.0
    ticket.wake = woken = Woken()
    rules.adopt(live, None, pause, clock())
    assert slot.pause_until == clock() + pause
    assert record_of(slot).delay == 1.0
    assert woken.count == 1
    # A pause that ends no later than the one in force changes nothing.
    rules.adopt(live, None, pause / 2, clock())
    assert slot.pause_until == clock() + pause
    assert woken.count == 1
    # The delay and the pause together: one wake.
    rules.adopt(live, 2.0, 2 * pause, clock())
    assert (slot.delay, slot.pause_until) == (2.0, clock() + 2 * pause)
    assert woken.count == 2
    first.release()


# -- fail: a request that got no response -----------------------------------------------


def test_a_failure_tells_the_listeners_its_slot_and_the_error_s_name() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=1.0)
    events: list[ThrottleEvent] = []
    throttle.listen(events.append)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.fail(ConnectionResetError("reset by peer"))
    lease.release()
    assert events == [
        ThrottleEvent("failure", KEY, reason="ConnectionResetError"),
        ThrottleEvent("backoff", KEY, reason="failure: ConnectionResetError"),
    ]


# -- pause: capped at max_pause, with one warning per kind of pause ---------------------


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_pause_of_exactly_max_pause_is_not_capped(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0, max_pause=20.0)
    with caplog.at_level(logging.WARNING, logger="autothrottle"):
        throttle.backoff(KEY, pause=20.0)
    assert throttle.slot(KEY).pause_until == clock() + 20.0
    assert _warnings(caplog) == []


def test_each_kind_of_pause_is_warned_of_once_when_capped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The note's kind is the pause's reason: a Retry-After capped does not hide
    # that a manual pause was capped too; the same kind again is not repeated.
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.0, max_pause=20.0)
    with caplog.at_level(logging.WARNING, logger="autothrottle"):
        throttle.observe(KEY, latency=0.01, status=429, headers={"Retry-After": "60"})
        throttle.backoff(KEY, pause=60.0)
        clock.advance(30.0)
        throttle.backoff(KEY, pause=60.0)
    warned = _warnings(caplog)
    assert len(warned) == 2
    assert "Retry-After of 60s capped to max_pause=20s" in warned[0]
    assert "manual pause of 60s capped to max_pause=20s" in warned[1]
    assert throttle.slot(KEY).pause_until == clock() + 20.0
