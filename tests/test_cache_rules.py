"""The cache rules through a throttle, on a hand-set clock: the hits in flight.

docs/signals.md, "Caches": a policy with no in-flight cap of its own
(``AutoThrottlePolicy``) counts the hits in flight against its target, as
Scrapy's setting means requests in flight at the site. The delay adds the
hits' share of the time in flight over the target, ``(1 - miss_share) *
hit_latency / target_concurrency``, outside what the policy is handed.
"""

from __future__ import annotations

import logging

import pytest

from autothrottle import AutoThrottlePolicy, Throttle
from helpers import FakeClock, record_of

KEY = "cdn.example"
HIT = {"X-Cache": "HIT", "Age": "30"}
MISS = {"X-Cache": "MISS", "Age": "0"}


@pytest.mark.parametrize(("hit_latency", "target"), [(0.02, 2.0), (0.05, 4.0)])
def test_the_hits_in_flight_count_against_the_target(hit_latency: float, target: float) -> None:
    # 9 hits in 10, misses of 0.2 s: the origin's part is Scrapy's rule behind
    # the cache (0.2 / target a miss, one send in ten, 2 / 1.1 of it), and the
    # hits' 0.9 x hit_latency / target on top. Without the hits' part the delay
    # is a third to a half lower; with it multiplied by the target, twice or more.
    clock = FakeClock()
    throttle = Throttle(
        clock=clock,
        wall_clock=clock.wall,
        policy=AutoThrottlePolicy(),
        start_delay=1.0,
        target_concurrency=target,
    )
    for i in range(2000):
        miss = i % 10 == 0
        latency = 0.2 if miss else hit_latency
        throttle.observe(KEY, latency=latency, status=200, headers=MISS if miss else HIT)
    slot = throttle.slot(KEY)
    share = record_of(slot).miss_share
    assert share == pytest.approx(0.1, rel=0.1)
    origin = 0.2 / target * share * 2 / (1 + share)
    hits = (1 - share) * hit_latency / target
    assert slot.delay == pytest.approx(origin + hits, rel=0.12)


def test_a_slow_hit_raises_the_delay_to_its_latency_over_the_target() -> None:
    # As any response may under Scrapy's rule: a hit of 3 s at a target of 2
    # raises the delay to 1.5 s, not to 3 s.
    clock = FakeClock()
    throttle = Throttle(
        clock=clock, policy=AutoThrottlePolicy(), start_delay=0.5, target_concurrency=2.0
    )
    throttle.observe(KEY, latency=0.5, status=200, headers=MISS)
    throttle.observe(KEY, latency=3.0, status=200, headers=HIT)
    assert throttle.slot(KEY).delay == pytest.approx(1.5)


@pytest.mark.parametrize("lower", [False, True])
def test_a_delay_a_hit_set_is_logged_as_a_cache_hit(
    lower: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # docs/guide.md, "Reading the debug output": the reason is what set the new
    # delay; a hit's, by the miss share or (cache_hits_lower_delay) as any response.
    clock = FakeClock()
    throttle = Throttle(
        clock=clock,
        policy=AutoThrottlePolicy(),
        start_delay=2.0,
        debug=True,
        cache_hits_lower_delay=lower,
    )
    throttle.observe(KEY, latency=1.0, status=200, headers=MISS)
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        throttle.observe(KEY, latency=0.05, status=200, headers=HIT)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].endswith("reason=cache hit")
