"""The rules at edges a mutation run (``scripts/mutants.py _rules``) showed no
test asserted, on a hand-set clock (docs/signals.md, docs/recovery.md).
"""

from __future__ import annotations

import math

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, Throttle
from helpers import FakeClock, record_of

KEY = "cdn.example"
HIT = {"X-Cache": "HIT", "Age": "30"}
MISS = {"X-Cache": "MISS", "Age": "0"}


def test_the_cap_counts_the_hits_in_flight_at_min_delay_when_the_sends_keep_it() -> None:
    # docs/signals.md, "In-flight cap": the cap is the policy's limit plus the
    # hits in flight at the pace of the sends (Little's law). Here the policy
    # asks for about 6 ms, but min_delay holds the sends 50 ms apart: the hits
    # in flight are counted at 50 ms, not at the pace nobody keeps.
    clock = FakeClock()
    policy = AdaptiveConcurrencyPolicy(initial_limit=2.0, ramp_up=None)
    throttle = Throttle(
        clock=clock,
        wall_clock=clock.wall,
        start_delay=0.05,
        min_delay=0.05,
        max_concurrency=64,
        policy=policy,
    )
    for i in range(201):  # one miss in ten, the last one a miss
        miss = i % 10 == 0
        throttle.observe(
            KEY, latency=0.2 if miss else 0.02, status=200, headers=MISS if miss else HIT
        )
    state = record_of(throttle.slot(KEY))
    assert state.delay == 0.05
    hits = (1.0 - state.miss_share) * state.hit_latency / 0.05
    assert 0.0 < hits < 1.0
    limit = policy.in_flight_limit(state.policy_state)
    assert limit is not None
    assert state.in_flight_cap == math.ceil(limit + hits) == 3


@pytest.mark.parametrize("refused", [False, True])
def test_after_a_refusal_the_ramp_no_longer_holds_the_delay(refused: bool) -> None:
    # docs/signals.md, "Ramp-up": the ramp bounds how fast a slot never refused
    # speeds up; after the first refusal the recovery floor bounds the way down
    # instead. A refusal at a gap well under a second counts as one too.
    clock = FakeClock()
    throttle = Throttle(clock=clock, start_delay=0.2, policy=AdaptiveConcurrencyPolicy())
    slot = throttle.slot(KEY)
    throttle.observe(KEY, latency=0.05, status=200)
    if refused:
        throttle.observe(KEY, latency=0.05, status=429)
        assert 0.0 < record_of(slot).refused_gap <= 1.0
    clock.advance(60.0)  # the recovery floor is far below by now
    throttle.observe(KEY, latency=0.01, status=200)  # the ramp counts from here
    slot.delay = 2.0
    clock.advance(0.01)
    throttle.observe(KEY, latency=0.01, status=200)
    if refused:
        assert slot.delay == pytest.approx(0.01)  # what the policy asked for
    else:  # halving at most each second, from 2 s
        assert slot.delay == pytest.approx(2.0 * 2.0 ** (-0.01), rel=1e-3)


def test_a_cache_s_304_is_never_counted_as_a_miss() -> None:
    # docs/signals.md, "Caches": the miss share is the share of sends that
    # reach the origin. A 304 a cache answered did not reach it: the share
    # stays where the hits and misses before it left it.
    clock = FakeClock()
    throttle = Throttle(clock=clock, wall_clock=clock.wall, start_delay=1.0)
    throttle.observe(KEY, latency=0.5, status=200, headers=MISS)
    throttle.observe(KEY, latency=0.01, status=200, headers=HIT)
    state = record_of(throttle.slot(KEY))
    assert state.miss_share == pytest.approx(0.5)
    throttle.observe(KEY, latency=0.01, status=304, headers=HIT)
    assert state.miss_share == pytest.approx(0.5)


def test_the_cap_counts_more_than_one_hit_in_flight_at_a_fast_pace() -> None:
    # Little's law with hits slower than the gap between sends: more than one
    # hit is in flight, and the cap makes room for each of them.
    clock = FakeClock()
    policy = AdaptiveConcurrencyPolicy(initial_limit=2.0, ramp_up=None)
    throttle = Throttle(
        clock=clock, wall_clock=clock.wall, start_delay=0.0, max_concurrency=64, policy=policy
    )
    for i in range(201):
        miss = i % 10 == 0
        throttle.observe(
            KEY, latency=0.2 if miss else 0.02, status=200, headers=MISS if miss else HIT
        )
    state = record_of(throttle.slot(KEY))
    hits = (1.0 - state.miss_share) * state.hit_latency / state.delay
    assert hits > 2.0
    limit = policy.in_flight_limit(state.policy_state)
    assert limit is not None
    assert state.in_flight_cap == math.ceil(limit + hits)


def test_the_adaptive_policy_never_learns_the_origin_from_a_cache_hit() -> None:
    # Even where hits may lower the delay (cache_hits_lower_delay), a hit's
    # latency is the cache's: the adaptive policy's record of the origin
    # (its base latency, its limit) is left as the misses made it.
    clock = FakeClock()
    throttle = Throttle(
        clock=clock,
        wall_clock=clock.wall,
        start_delay=1.0,
        cache_hits_lower_delay=True,
        policy=AdaptiveConcurrencyPolicy(ramp_up=None),
    )
    throttle.observe(KEY, latency=0.5, status=200, headers=MISS)
    state = record_of(throttle.slot(KEY))
    before, delay = dict(state.policy_state), throttle.slot(KEY).delay
    throttle.observe(KEY, latency=0.01, status=200, headers=HIT)
    assert dict(state.policy_state) == before
    assert throttle.slot(KEY).delay == delay
