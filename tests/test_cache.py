"""The cache estimate through its own interface, with plain numbers
(docs/signals.md, "Caches" and "In-flight cap").

Only :class:`CacheShare`, its :class:`Cache` record and plain numbers: no
throttle, slot or clock.
"""

from __future__ import annotations

import math
import random

import pytest

from autothrottle._cache import MIN_SHARE, Cache, CacheShare


def feed(cache: Cache, hits: list[bool], latency: float = 0.005) -> None:
    """One response per entry (True: a cache hit), counted from the first."""
    for n, hit in enumerate(hits, start=1):
        if hit:
            CacheShare.hit(cache, latency, n, 1.0)
        else:
            CacheShare.miss(cache, n)


def test_the_share_starts_as_the_plain_mean_of_the_responses() -> None:
    cache = Cache()
    feed(cache, [False, True, True, True, False, True, True, True, True, True])
    assert cache.miss_share == pytest.approx(0.2)


def test_later_each_response_weighs_one_percent() -> None:
    cache = Cache(miss_share=0.5)
    assert CacheShare.miss(cache, 1000) == pytest.approx(0.5 + 0.01 * 0.5)


def test_a_cache_that_answers_everything_still_has_an_origin() -> None:
    cache = Cache()
    feed(cache, [True] * 2000)
    assert cache.miss_share == MIN_SHARE


def test_a_hit_moves_the_delay_with_the_share() -> None:
    cache = Cache(miss_share=0.5)
    moved = CacheShare.hit(cache, 0.005, 1000, 2.0)
    assert cache.miss_share == pytest.approx(0.495)
    assert moved == pytest.approx(2.0 * 0.495 / 0.5)


def test_the_hit_latency_is_averaged_from_the_first_hit() -> None:
    cache = Cache()
    CacheShare.hit(cache, 0.010, 1, 1.0)
    assert cache.hit_latency == 0.010
    CacheShare.hit(cache, 0.020, 2, 1.0)
    assert cache.hit_latency == pytest.approx(0.011)


@pytest.mark.parametrize(
    ("share", "capped", "headroom"),
    [(0.1, True, 0.55), (1.0, True, 1.0), (0.1, False, 2 / 1.1), (1.0, False, 1.0)],
)
def test_a_capped_pace_gets_headroom_and_an_uncapped_one_scrapys_lag(
    share: float, capped: bool, headroom: float
) -> None:
    assert CacheShare.headroom(share, capped=capped) == pytest.approx(headroom)


def test_scrapys_rule_keeps_about_half_its_target_at_a_cached_origin() -> None:
    # Scrapy's rule run response by response: 10 % misses of 200 ms, hits of
    # 5 ms, target 4. The origin's share of the sends over the sum of the
    # delays in force at each send is what it holds in flight (Little's law).
    rng = random.Random(7)
    delay, total, misses = 0.5, 0.0, 0
    for _ in range(200_000):
        miss = rng.random() < 0.1
        total += delay
        misses += miss
        target = (0.2 if miss else 0.005) / 4
        delay = max(target, (delay + target) / 2)
    at_origin = misses / total * 0.2
    # Our pace without a cap: the origin's gap (0.2 / 4) through the headroom,
    # and the hits' time in flight (0.9 x 5 ms over the target) on top.
    hits = CacheShare.hit_time(Cache(hit_latency=0.005), 0.1) / 4
    ours = CacheShare.pace_origin(0.1, 0.01, lambda gap: 0.2 / 4, capped=False, hits=hits)
    assert at_origin == pytest.approx(0.1 / ours * 0.2, rel=0.05)
    assert at_origin < 4 * (1 + 0.1) / 2  # about half the target, not the target


def test_the_cap_is_the_origins_limit_plus_the_hits_in_flight() -> None:
    # 90 % hits of 5 ms, a send every 10 ms: 0.45 hits in flight on average.
    cache = Cache(miss_share=0.1, hit_latency=0.005)
    assert CacheShare.cap(cache, 2.0, 0.01) is False  # the first cap is no rise
    assert cache.in_flight_cap == math.ceil(2.0 + 0.45)
    assert CacheShare.cap(cache, 3.0, 0.01) is True  # a rise: the gate must re-check
    assert cache.in_flight_cap == 4
    assert CacheShare.cap(cache, 0.2, 1.0) is False
    assert cache.in_flight_cap == 1  # never below one


def test_a_loaded_cap_is_held_to_the_loading_slots_max_concurrency() -> None:
    cache = Cache(in_flight_cap=10**6)
    CacheShare.bound(cache, 8)
    assert cache.in_flight_cap == 8


def test_the_policy_paces_the_origin_and_its_answer_is_scaled_back() -> None:
    asked: list[float] = []

    def policy(gap: float) -> float:
        asked.append(gap)
        return 0.2  # the origin's gap the policy wants

    # One send in ten reaches the origin: a 20 ms delay is a 200 ms origin gap.
    # Without a cap, the origin as Scrapy's rule holds it: 2 / (1 + 0.1) slower.
    assert CacheShare.pace_origin(0.1, 0.02, policy, capped=False) == pytest.approx(0.02 * 2 / 1.1)
    assert asked == [pytest.approx(0.2 * 1.1 / 2)]
    # A capped policy gets headroom (1 + 0.1) / 2 on top: up to twice the rate.
    assert CacheShare.pace_origin(0.1, 0.02, policy, capped=True) == pytest.approx(0.011)


def test_the_hits_in_flight_are_littles_law() -> None:
    # 90 % hits of 50 ms, a send every 10 ms: 90 hits a second, each 50 ms in
    # flight, 4.5 at once on average, on top of the origin's limit of 2.
    cache = Cache(miss_share=0.1, hit_latency=0.05)
    CacheShare.cap(cache, 2.0, 0.01)
    assert cache.in_flight_cap == 7  # ceil(2 + 4.5)
    # Seconds of hits in flight per send: their share times their latency.
    assert CacheShare.hit_time(cache, 0.1) == pytest.approx(0.9 * 0.05)
    assert CacheShare.hit_time(cache, 1.0) == 0.0  # no hits, none in flight


def test_a_cap_that_rises_from_one_request_wakes_the_gate() -> None:
    cache = Cache(in_flight_cap=1)
    assert CacheShare.cap(cache, 2.0, 0.01) is True
    assert CacheShare.cap(cache, 2.0, 0.01) is False  # unchanged: nothing to re-check
    assert CacheShare.cap(cache, 0.0, 0.01) is False
    assert cache.in_flight_cap == 1  # a limit of none still lets one request go


def test_the_first_response_a_hit_reads_a_share_of_none() -> None:
    # The first responses weigh 1/n: a hit first reads a share of 0 (floored at
    # 1 %), and a miss after it the plain mean of the two, a half.
    cache = Cache()
    feed(cache, [True, False])
    assert cache.miss_share == pytest.approx((MIN_SHARE + 1.0) / 2)


def test_the_hits_time_is_kept_out_of_what_the_policy_is_handed() -> None:
    asked: list[float] = []

    def policy(gap: float) -> float:
        asked.append(gap)
        return gap

    # Uncapped at a share of 1/2: headroom 2 / 1.5. Of a 0.1 s delay, 0.04 s pace
    # the hits in flight: the policy is handed the rest, over share and headroom,
    # and the hits' time is added back to its answer.
    headroom = 2.0 / 1.5
    delay = CacheShare.pace_origin(0.5, 0.1, policy, capped=False, hits=0.04)
    assert asked == [pytest.approx(0.06 / (0.5 * headroom))]
    assert delay == pytest.approx(0.1)
