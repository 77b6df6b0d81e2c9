"""The fleet's share of a host's answers, with an injected clock (docs/fleet.md).

A process in a fleet of N sees one answer in N: the rule that takes a refusal
at the configured pace for jitter (docs/recovery.md, "At the stated pace")
judges the pace the host let through from this process's successes times N.
"""

from __future__ import annotations

from autothrottle import FixedRatePolicy, Throttle
from helpers import FakeClock

KEY = "example.com"


def share_of_a_fleet(senders: int) -> Throttle:
    """A throttle at FixedRatePolicy(2) that sent every 4th request of a host
    at 2/s for 8 s (the fleet's turns between its own), then was refused once."""
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=FixedRatePolicy(2.0))
    throttle._live(KEY).senders = senders
    for _ in range(4):
        clock.advance(2.0)  # its share: every 4th turn of sends 0.5 s apart
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        lease.observe(latency=0.010, status=200)
        lease.release()
    clock.advance(2.0)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.observe(latency=0.001, status=429, headers={"Retry-After": "1"})
    lease.release()
    return throttle


def test_a_refusal_at_the_fleets_pace_costs_a_margin_step_not_a_backoff() -> None:
    throttle = share_of_a_fleet(senders=4)
    assert throttle.slot(KEY).delay == 0.5  # the host let the fleet keep 2/s


def test_the_same_answers_alone_are_a_slower_pace_and_the_refusal_a_real_one() -> None:
    throttle = share_of_a_fleet(senders=1)
    assert throttle.slot(KEY).delay == 1.0  # 0.5/s got through: 2/s is too fast
