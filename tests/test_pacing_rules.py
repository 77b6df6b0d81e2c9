"""Pacing rules beyond Scrapy's: caches, the ramp-up, and a policy's own in-flight cap.

The rules are in docs/signals.md ("Caches", "Ramp-up", "In-flight cap"); every
expected number below is worked out from them by hand, with a hand-set clock.
"""

from __future__ import annotations

import math

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, AutoThrottlePolicy, Throttle
from helpers import FakeClock, gate_of, grant_now, record_of

KEY = "cdn.example"
HIT = {"X-Cache": "HIT", "Age": "30"}
MISS = {"X-Cache": "MISS", "Age": "0"}


def fake(**kwargs: object) -> tuple[FakeClock, Throttle]:
    """A throttle on a fake clock: Scrapy's rules unless a test names another policy."""
    clock = FakeClock()
    kwargs.setdefault("policy", AutoThrottlePolicy())
    return clock, Throttle(clock=clock, wall_clock=clock.wall, **kwargs)  # type: ignore[arg-type]


def test_hits_before_any_miss_are_paced_as_any_response() -> None:
    # Nothing is known of an origin yet (a site may be served wholly from cache):
    # AutoThrottle's rule on the hit, (2 + 0.005) / 2, not the start delay for ever.
    _, throttle = fake(start_delay=2.0)
    throttle.observe(KEY, latency=0.005, status=200, headers=HIT)
    assert throttle.slot(KEY).delay == pytest.approx(1.0025)
    for _ in range(49):
        throttle.observe(KEY, latency=0.005, status=200, headers=HIT)
    assert throttle.slot(KEY).delay == pytest.approx(0.005)


def test_hits_before_any_miss_lower_the_delay_no_faster_than_the_ramp_up() -> None:
    clock, throttle = fake(start_delay=2.0, policy=AdaptiveConcurrencyPolicy())
    throttle.observe(KEY, latency=0.005, status=200, headers=HIT)
    first = throttle.slot(KEY).delay
    for _ in range(10):
        clock.advance(0.1)
        throttle.observe(KEY, latency=0.005, status=200, headers=HIT)
    # Ten hits would take AutoThrottle's rule to 2 ms; the ramp halves it per second.
    assert throttle.slot(KEY).delay == pytest.approx(first / 2.0)


def test_a_hit_lowers_the_delay_only_through_the_share_of_misses() -> None:
    _, throttle = fake(start_delay=2.0)
    throttle.observe(KEY, latency=1.0, status=200, headers=MISS)  # AutoThrottle: 1.5 s
    assert throttle.slot(KEY).delay == pytest.approx(1.5)
    throttle.observe(KEY, latency=0.005, status=200, headers=HIT)
    # The first responses weigh 1/n: one miss and one hit make a share of 1/2.
    assert record_of(throttle.slot(KEY)).miss_share == pytest.approx(0.5)
    assert throttle.slot(KEY).delay == pytest.approx(1.5 * 0.5)
    for _ in range(200):
        throttle.observe(KEY, latency=0.005, status=200, headers=HIT)
    # From the 100th response on each weighs 1 %: 99 more hits lower it by 0.99 each.
    share = 1.0 / 100 * 0.99**101
    assert record_of(throttle.slot(KEY)).miss_share == pytest.approx(max(share, 0.01))


def test_the_miss_share_starts_as_the_plain_mean() -> None:
    _, throttle = fake(start_delay=1.0)
    for i in range(40):
        miss = i % 4 == 0
        throttle.observe(KEY, latency=0.1, status=200, headers=MISS if miss else HIT)
    assert record_of(throttle.slot(KEY)).miss_share == pytest.approx(0.25, abs=0.02)


def test_the_origin_is_paced_as_scrapys_rule_holds_it_and_hits_flow_between() -> None:
    # 9 hits in 10, misses take 0.2 s at the origin, target 1: origin gap 0.2 s,
    # one send in ten reaches it, so at the target the slot would send every
    # 0.02 s. Scrapy's rule holds (1 + 0.1) / 2 of the target there (hits halve
    # a miss's delay, docs/signals.md "Caches"): every 0.02 * 2 / 1.1 s, and the
    # hits' 0.9 x 5 ms in flight on top.
    _, throttle = fake(start_delay=1.0, target_concurrency=1.0)
    for i in range(2000):
        miss = i % 10 == 0
        throttle.observe(
            KEY, latency=0.2 if miss else 0.005, status=200, headers=MISS if miss else HIT
        )
    slot = throttle.slot(KEY)
    assert record_of(slot).miss_share == pytest.approx(0.1, rel=0.35)
    assert slot.delay == pytest.approx(0.02 * 2 / 1.1 + 0.9 * 0.005, rel=0.35)
    # Little's law at the origin: sends/s x miss share x miss latency
    origin_in_flight = (1.0 / slot.delay) * 0.1 * 0.2
    assert origin_in_flight == pytest.approx(1.1 / 2, rel=0.35)


def test_a_slow_hit_still_raises_the_delay() -> None:
    _, throttle = fake(start_delay=0.5)
    throttle.observe(KEY, latency=0.5, status=200, headers=MISS)
    throttle.observe(KEY, latency=3.0, status=200, headers=HIT)
    assert throttle.slot(KEY).delay == 3.0


def test_cache_hits_lower_delay_restores_the_plain_rule() -> None:
    _, throttle = fake(start_delay=2.0, cache_hits_lower_delay=True)
    throttle.observe(KEY, latency=0.05, status=200, headers=HIT)
    slot = throttle.slot(KEY)
    assert slot.delay == pytest.approx(1.025)  # Scrapy: (2 + 0.05) / 2
    assert record_of(slot).miss_share == 1.0


def test_strict_scrapy_ignores_cache_status() -> None:
    _, throttle = fake(start_delay=2.0, strict_scrapy=True)
    throttle.observe(KEY, latency=1.0, status=200, headers=MISS)
    throttle.observe(KEY, latency=0.05, status=200, headers=HIT)
    assert throttle.slot(KEY).delay == pytest.approx((1.5 + 0.05) / 2)


# -- ramp-up ---------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [0.0, 0.5, 1.0, 3.0])
def test_the_rate_at_most_doubles_each_ramp_up_period(seconds: float) -> None:
    clock, throttle = fake(start_delay=1.0, policy=AdaptiveConcurrencyPolicy(ramp_up=1.0))
    throttle.slot(KEY)  # the ramp counts from the slot's creation
    clock.advance(seconds)
    throttle.observe(KEY, latency=0.001, status=200)
    assert throttle.slot(KEY).delay == pytest.approx(2.0**-seconds)


@pytest.mark.parametrize("seconds", [0.0, 0.2, 0.4])
def test_a_fast_slot_doubles_every_eight_sends_if_sooner(seconds: float) -> None:
    # At a 50 ms delay eight sends take 0.4 s, sooner than the 1 s ramp_up.
    clock, throttle = fake(start_delay=0.05, policy=AdaptiveConcurrencyPolicy(ramp_up=1.0))
    throttle.slot(KEY)
    clock.advance(seconds)
    throttle.observe(KEY, latency=0.0001, status=200)
    assert throttle.slot(KEY).delay == pytest.approx(0.05 * 2.0 ** (-seconds / 0.4))


def test_the_ramp_compounds_over_many_responses() -> None:
    clock, throttle = fake(start_delay=1.0, policy=AdaptiveConcurrencyPolicy(ramp_up=2.0))
    throttle.slot(KEY)
    for _ in range(40):
        clock.advance(0.1)
        throttle.observe(KEY, latency=0.001, status=200)
    assert throttle.slot(KEY).delay == pytest.approx(2.0**-2.0)  # 4 s / 2 s: two doublings


def test_the_ramp_never_raises_the_delay_and_ends_at_the_first_refusal() -> None:
    clock, throttle = fake(start_delay=1.0, policy=AdaptiveConcurrencyPolicy(ramp_up=1.0))
    clock.advance(1.0)
    throttle.observe(KEY, latency=2.0, status=200)  # a slow response raises at once
    assert throttle.slot(KEY).delay == pytest.approx(2.0)
    throttle.observe(KEY, latency=0.1, status=429)
    slot = throttle.slot(KEY)
    assert record_of(slot).refused_gap > 0
    # after a refusal the recovery floor, not the ramp, bounds the way down
    clock.advance(60.0)
    before = slot.delay
    throttle.observe(KEY, latency=0.001, status=200)
    assert slot.delay < before / 2.0


def test_scrapys_policy_has_no_ramp() -> None:
    _, throttle = fake(start_delay=1.0, policy=AutoThrottlePolicy())
    throttle.observe(KEY, latency=0.0, status=200)
    assert throttle.slot(KEY).delay == 0.5


# -- a policy's own in-flight cap ----------------------------------------------------


def test_the_adaptive_limit_caps_requests_in_flight() -> None:
    policy = AdaptiveConcurrencyPolicy(initial_limit=2.0, ramp_up=None)
    clock, throttle = fake(start_delay=0.0, min_delay=0.0, max_concurrency=8, policy=policy)
    slot = throttle.slot(KEY)
    first = throttle.try_acquire(KEY)
    assert first is not None
    first.observe(latency=0.0001, status=200)
    assert record_of(slot).in_flight_cap == 2
    clock.advance(1.0)
    held = [first, throttle.try_acquire(KEY)]
    assert held[1] is not None
    assert gate_of(slot).cap() == 2
    clock.advance(1.0)
    assert grant_now(slot) is None  # a third would exceed the policy's limit
    for lease in held:
        lease.release()  # type: ignore[union-attr]
    assert grant_now(slot) is not None


def test_behind_a_cache_the_cap_is_the_origins_limit_plus_the_hits_in_flight() -> None:
    policy = AdaptiveConcurrencyPolicy(initial_limit=2.0, ramp_up=None)
    _, throttle = fake(start_delay=0.0, max_concurrency=64, policy=policy)
    slot = throttle.slot(KEY)
    for i in range(201):  # the last one a miss: the cap is set by misses
        miss = i % 10 == 0
        throttle.observe(
            KEY, latency=0.2 if miss else 0.005, status=200, headers=MISS if miss else HIT
        )
    state = record_of(slot)
    # Paced with headroom: the policy's origin gap times the share, over (1 + share) / 2.
    share = state.miss_share
    origin_gap = state.policy_state["base"] / state.policy_state["limit"]
    assert state.delay == pytest.approx(origin_gap * share * (1.0 + share) / 2.0)
    # Little's law: hits in flight = hit send rate x hit latency.
    hit_latency = state.hit_latency
    assert hit_latency == pytest.approx(0.005) and hit_latency is not None
    hits = (1.0 - state.miss_share) * hit_latency / state.delay
    assert 0.1 < hits < 1.0
    limit = policy.in_flight_limit(state.policy_state)
    assert limit is not None and state.in_flight_cap == math.ceil(limit + hits)
    # Not the limit over the miss share (20 or more): that would let the
    # misses queue at the origin.
    assert state.in_flight_cap <= 4


def test_max_concurrency_still_caps_below_the_policy() -> None:
    policy = AdaptiveConcurrencyPolicy(initial_limit=50.0, ramp_up=None)
    _, throttle = fake(start_delay=0.0, max_concurrency=3, policy=policy)
    throttle.observe(KEY, latency=0.01, status=200)
    assert gate_of(throttle.slot(KEY)).cap() == 3
    assert not math.isinf(throttle.slot(KEY).delay)


def test_the_ramp_up_lowers_the_delay_as_time_passes_not_only_on_responses() -> None:
    # The first response asks for a 10 ms delay; the ramp holds 5 s and halves
    # it each second. The second send goes at t = 5 * 2 ** -t, about 1.7 s in,
    # not after the whole start delay.
    clock = FakeClock()
    throttle = Throttle(policy=AdaptiveConcurrencyPolicy(), start_delay=5.0, clock=clock)
    lease = throttle.try_acquire("a")
    assert lease is not None
    lease.observe(latency=0.01, status=200)
    lease.release()
    slot = throttle.slot("a")
    assert slot.delay == pytest.approx(5.0, rel=0.01)
    clock.advance(1.5)
    assert throttle.try_acquire("a") is None
    clock.advance(0.3)
    assert throttle.try_acquire("a") is not None


def test_the_ramp_never_holds_a_slot_slower_than_a_pace_the_host_stated() -> None:
    # The host says 10 a second from its first answer: there is nothing to ramp
    # up to, and the next send goes a tenth of a second later, not after the
    # ramp has halved the 5 s start delay a few times.
    clock = FakeClock()
    throttle = Throttle(policy=AdaptiveConcurrencyPolicy(), start_delay=5.0, clock=clock)
    lease = throttle.try_acquire("api")
    assert lease is not None
    stated = {"RateLimit-Policy": '"p";q=10;w=1', "RateLimit": '"p";r=9;t=1'}
    lease.observe(latency=0.01, status=200, headers=stated)
    lease.release()
    assert throttle.slot("api").delay == pytest.approx(0.1)
    clock.advance(0.099)
    assert throttle.try_acquire("api") is None
    clock.advance(0.001)
    assert throttle.try_acquire("api") is not None


def test_the_headers_spacing_holds_while_the_ramp_up_runs() -> None:
    # The ramp lowers the delay to 41 ms within the second; the quota of
    # 10/s still spaces sends 102 ms apart (docs/signals.md, "Rate-limit headers").
    policy = AdaptiveConcurrencyPolicy(ramp_up=0.25)
    clock, throttle = fake(start_delay=0.5, policy=policy)
    slot = throttle.slot(KEY)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    headers = {"RateLimit-Policy": '"p";q=10;w=1', "RateLimit": '"p";r=5;t=1'}
    lease.observe(latency=0.001, status=200, headers=headers)
    lease.release()
    assert record_of(slot).ramp_to > 0.0  # the ramp holds the delay
    clock.advance(0.9)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.release()
    assert gate_of(slot).send_at(clock()) >= clock() + 0.1


def test_a_backoff_ends_the_ramp_the_backed_off_delay_holds() -> None:
    # The ramp held a 5 s start delay falling toward 10 ms; a 429 doubles the
    # delay. The gate must not let the doubled delay fall toward what the ramp
    # held back before the refusal (the next send went 1.1 s after the last).
    clock = FakeClock()
    throttle = Throttle(policy=AdaptiveConcurrencyPolicy(), start_delay=5.0, clock=clock)
    lease = throttle.try_acquire("a")
    assert lease is not None
    lease.observe(latency=0.01, status=200)
    lease.release()
    clock.advance(2.0)
    second = throttle.try_acquire("a")
    assert second is not None
    clock.advance(0.1)
    second.observe(latency=0.01, status=429)
    second.release()
    slot = throttle.slot("a")
    assert slot.delay == pytest.approx(10.0, rel=0.05)
    assert record_of(slot).ramp_to == 0.0
    gate = gate_of(slot)
    assert gate.last_send is not None
    assert gate.send_at(clock()) >= gate.last_send + slot.delay


def test_a_delay_set_by_hand_ends_the_ramp() -> None:
    clock = FakeClock()
    throttle = Throttle(policy=AdaptiveConcurrencyPolicy(), start_delay=5.0, clock=clock)
    lease = throttle.try_acquire("a")
    assert lease is not None
    lease.observe(latency=0.01, status=200)
    lease.release()
    slot = throttle.slot("a")
    slot.delay = 3.0
    clock.advance(2.0)
    assert throttle.try_acquire("a") is None  # 3 s hold, not the ramp's fall


def test_a_response_that_may_not_lower_the_delay_leaves_no_ramp_to_fall_along() -> None:
    class Ramping(AutoThrottlePolicy):
        ramp_up = 1.0

    clock = FakeClock()
    throttle = Throttle(policy=Ramping(), start_delay=2.0, clock=clock)
    lease = throttle.try_acquire("a")
    assert lease is not None
    lease.observe(latency=0.01, status=404)  # a 404 never lowers the delay
    lease.release()
    slot = throttle.slot("a")
    assert (slot.delay, record_of(slot).ramp_to) == (2.0, 0.0)
    clock.advance(1.9)
    assert throttle.try_acquire("a") is None
    clock.advance(0.1)
    assert throttle.try_acquire("a") is not None


STATED = {"RateLimit-Policy": '"p";q=10;w=1', "RateLimit": '"p";r=9;t=1'}


def test_scrapys_rule_adapts_from_the_pace_the_host_states_not_from_the_start_delay() -> None:
    # Scrapy's settings start at 0.5 s; the first answer says 10 a second. The
    # rule adapts from 0.1 s, (0.1 + 0.01) / 2, and the gap begun at 0.5 s is
    # shortened too: the next send goes 0.1 s after the first, not 0.5 s.
    clock, throttle = fake(start_delay=0.5)
    slot = throttle.slot(KEY)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    clock.advance(0.01)
    lease.observe(latency=0.01, status=200, headers=STATED)
    lease.release()
    assert slot.delay == pytest.approx(0.055)
    clock.advance(0.089)
    assert throttle.try_acquire(KEY) is None
    clock.advance(0.001)
    assert throttle.try_acquire(KEY) is not None


def test_a_stated_pace_lowers_the_delay_no_further_than_the_policys_target() -> None:
    # A host that says 10 a second but answers in 300 ms: Scrapy's rule keeps
    # its target, 0.3 s, whatever the host states.
    clock, throttle = fake(start_delay=0.5)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    clock.advance(0.3)
    lease.observe(latency=0.3, status=200, headers=STATED)
    lease.release()
    assert throttle.slot(KEY).delay == pytest.approx(0.3)


def test_only_the_hosts_first_statement_replaces_the_delay() -> None:
    # Once the pace is stated, the rule adapts from its own delay again: a
    # delay that slow answers raised halves toward a fast one, as Scrapy's does.
    clock, throttle = fake(start_delay=0.5)
    slot = throttle.slot(KEY)
    for latency in (0.01, 2.0, 2.0, 0.01):
        clock.advance(max(0.0, gate_of(slot).send_at(clock()) - clock()))
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        clock.advance(latency)
        lease.observe(latency=latency, status=200, headers=STATED)
        lease.release()
    # 0.055, then the target 2.0 (above the halfway 1.03), 2.0 again, then
    # halfway from 2.0, not from the stated 0.1
    assert slot.delay == pytest.approx(1.005)
