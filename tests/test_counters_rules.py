"""The counters a snapshot reads, counted as the slot's doc says: each event once.

``SlotSnapshot.pauses`` is the times the slot was paused (``Retry-After``, an
exhausted budget, by hand), a pause made longer included, a shorter one not
(it changes nothing). A hand-set clock; no waits.
"""

from __future__ import annotations

from autothrottle import FixedDelayPolicy, Throttle
from helpers import FakeClock

KEY = "example.com"


def test_every_pause_that_holds_the_slot_longer_is_counted() -> None:
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=FixedDelayPolicy(0.1))
    throttle.observe(KEY, latency=0.01, status=503, headers={"Retry-After": "5"})
    throttle.observe(KEY, latency=0.01, status=503, headers={"Retry-After": "10"})
    assert throttle.slot(KEY).snapshot().pauses == 2
    throttle.observe(KEY, latency=0.01, status=503, headers={"Retry-After": "1"})  # within it
    assert throttle.slot(KEY).snapshot().pauses == 2
    clock.advance(20.0)
    throttle.backoff(KEY, pause=3.0)
    assert throttle.slot(KEY).snapshot().pauses == 3
