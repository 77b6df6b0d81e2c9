"""The default delay policy (Scrapy's AutoThrottle rules), as table tests.

Every expected delay below was worked out by hand from the rules (docs/signals.md
and the policy docstrings), not from the code:

* a new slot starts at ``max(start_delay, min_delay)``, bounded by ``max_delay``;
* a response of latency ``L`` sets ``target = L / target_concurrency`` and
  ``new = max(target, (delay + target) / 2)``, clamped to ``[min_delay, max_delay]``;
* a response whose status is not 200 may raise the delay but never lower it.

The rules are exercised through the public ``Throttle.observe``, both with
Scrapy's plain rules (``strict_scrapy=True``) and with the default settings:
for a response with no headers and a status that is not a backoff status
(429, 503 by default) the two must agree exactly.
"""

from __future__ import annotations

import math

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, AutoThrottlePolicy, Throttle

KEY = "example.com"


STRICT = pytest.param(True, id="strict")
DEFAULT = pytest.param(False, id="default")


@pytest.fixture(params=[STRICT, DEFAULT])
def strict(request: pytest.FixtureRequest) -> bool:
    """Run a test with Scrapy's plain rules and with the default settings."""
    return bool(request.param)


def make(
    start: float = 5.0,
    *,
    min_delay: float = 0.0,
    max_delay: float = 60.0,
    target_concurrency: float = 1.0,
    strict: bool = True,
) -> Throttle:
    return Throttle(
        policy=AutoThrottlePolicy(),
        start_delay=start,
        min_delay=min_delay,
        max_delay=max_delay,
        target_concurrency=target_concurrency,
        strict_scrapy=strict,
    )


# -- the start delay --------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "min_delay", "max_delay", "expected"),
    [
        (5.0, 0.0, 60.0, 5.0),  # start_delay wins over a lower min_delay
        (5.0, 7.0, 60.0, 7.0),  # min_delay wins over a lower start_delay
        (0.0, 0.0, 60.0, 0.0),
        (0.0, 0.25, 60.0, 0.25),
        (0.5, 2.0, 10.0, 2.0),
        (3.0, 3.0, 3.0, 3.0),  # all equal
        (90.0, 0.0, 60.0, 60.0),  # bounded by max_delay
        (5.0, 7.0, 7.0, 7.0),  # min_delay == max_delay
        (1, 0, 60, 1.0),  # ints are accepted
    ],
)
def test_new_slot_starts_at_max_of_start_and_min_delay(
    start: float, min_delay: float, max_delay: float, expected: float, strict: bool
) -> None:
    throttle = make(start, min_delay=min_delay, max_delay=max_delay, strict=strict)
    slot = throttle.slot(KEY)
    assert slot.delay == expected
    assert isinstance(slot.delay, float)
    assert slot.in_flight == 0


def test_scrapys_rules_start_at_scrapys_five_seconds() -> None:
    assert Throttle(policy=AutoThrottlePolicy()).slot(KEY).delay == 5.0
    assert Throttle(strict_scrapy=True).slot(KEY).delay == 5.0
    assert isinstance(Throttle(strict_scrapy=True).config.policy, AutoThrottlePolicy)


def test_the_default_policy_starts_at_one_second() -> None:
    throttle = Throttle()
    assert isinstance(throttle.config.policy, AdaptiveConcurrencyPolicy)
    assert throttle.slot(KEY).delay == 1.0


def test_each_new_slot_starts_fresh_at_the_start_delay(strict: bool) -> None:
    throttle = make(4.0, strict=strict)
    throttle.observe("a.example", latency=20.0, status=200)
    assert throttle.slot("a.example").delay == 20.0
    assert throttle.slot("b.example").delay == 4.0


# -- the averaging rule -----------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "latency", "target_concurrency", "expected"),
    [
        # target = L / N; new = max(target, (delay + target) / 2)
        (5.0, 1.0, 1.0, 3.0),  # target 1: (5 + 1) / 2 = 3
        (5.0, 1.0, 2.0, 2.75),  # target 0.5: (5 + 0.5) / 2 = 2.75
        (5.0, 12.0, 1.0, 12.0),  # target 12 > (5 + 12) / 2 = 8.5: jumps up to the target
        (5.0, 12.0, 4.0, 4.0),  # target 3: (5 + 3) / 2 = 4
        (5.0, 30.0, 4.0, 7.5),  # target 7.5 > (5 + 7.5) / 2 = 6.25
        (2.0, 3.0, 0.5, 6.0),  # target 6 > (2 + 6) / 2 = 4
        (1.0, 0.2, 0.25, 0.9),  # target 0.8: (1 + 0.8) / 2 = 0.9
        (4.0, 4.0, 1.0, 4.0),  # steady state: target == delay
        (0.5, 0.1, 8.0, 0.25625),  # target 0.0125: (0.5 + 0.0125) / 2
        (10.0, 1.5, 3.0, 5.25),  # target 0.5: (10 + 0.5) / 2
        (0.0, 1.0, 2.0, 0.5),  # from zero: target 0.5 > 0.25
        (8.0, 2.0, 1.0, 5.0),  # target 2: (8 + 2) / 2
        (6.0, 6.0, 3.0, 4.0),  # target 2: (6 + 2) / 2
        (3.0, 9.0, 2.0, 4.5),  # target 4.5 > 3.75
    ],
)
def test_averaging_rule(
    delay: float, latency: float, target_concurrency: float, expected: float, strict: bool
) -> None:
    throttle = make(delay, target_concurrency=target_concurrency, strict=strict)
    throttle.observe(KEY, latency=latency, status=200)
    assert throttle.slot(KEY).delay == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(
    ("start", "latencies", "target_concurrency", "expected"),
    [
        # 8 -> (8+2)/2=5 -> (5+2)/2=3.5 -> (3.5+2)/2=2.75
        (8.0, [2.0, 2.0, 2.0], 1.0, [5.0, 3.5, 2.75]),
        # targets 1, 5, 0.5: 5 -> 3 -> max(5, 4)=5 -> (5+0.5)/2=2.75
        (5.0, [2.0, 10.0, 1.0], 2.0, [3.0, 5.0, 2.75]),
        # target 4 every time, from below: jumps to 4 and stays
        (1.0, [4.0, 4.0], 1.0, [4.0, 4.0]),
    ],
)
def test_averaging_rule_over_a_sequence(
    start: float,
    latencies: list[float],
    target_concurrency: float,
    expected: list[float],
    strict: bool,
) -> None:
    throttle = make(start, target_concurrency=target_concurrency, strict=strict)
    seen = []
    for latency in latencies:
        throttle.observe(KEY, latency=latency, status=200)
        seen.append(throttle.slot(KEY).delay)
    assert seen == pytest.approx(expected, rel=1e-12)


def test_a_user_set_delay_is_the_base_of_the_next_adjustment(strict: bool) -> None:
    throttle = make(5.0, strict=strict)
    slot = throttle.slot(KEY)
    slot.delay = 9.0
    throttle.observe(KEY, latency=1.0, status=200)  # (9 + 1) / 2
    assert slot.delay == 5.0


def test_observe_only_changes_its_own_slot(strict: bool) -> None:
    throttle = make(5.0, strict=strict)
    other = throttle.slot("other.example")
    throttle.observe(KEY, latency=1.0, status=200)
    assert throttle.slot(KEY).delay == 3.0
    assert other.delay == 5.0


# -- zero latency -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "min_delay", "expected"),
    [
        (5.0, 0.0, 2.5),  # target 0: (5 + 0) / 2
        (0.0, 0.0, 0.0),  # stays at zero
        (5.0, 3.0, 3.0),  # 2.5 clamped up to min_delay
        (1.0, 0.0, 0.5),
    ],
)
def test_zero_latency_halves_the_delay(
    start: float, min_delay: float, expected: float, strict: bool
) -> None:
    throttle = make(start, min_delay=min_delay, strict=strict)
    throttle.observe(KEY, latency=0.0, status=200)
    assert throttle.slot(KEY).delay == expected


def test_zero_latency_integer_is_accepted(strict: bool) -> None:
    throttle = make(4.0, strict=strict)
    throttle.observe(KEY, latency=0, status=200)
    assert throttle.slot(KEY).delay == 2.0


def test_repeated_zero_latency_converges_towards_min_delay(strict: bool) -> None:
    throttle = make(4.0, min_delay=0.5, strict=strict)
    seen = []
    for _ in range(5):
        throttle.observe(KEY, latency=0.0, status=200)
        seen.append(throttle.slot(KEY).delay)
    assert seen == [2.0, 1.0, 0.5, 0.5, 0.5]


# -- clamping ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "min_delay", "max_delay", "latency", "target_concurrency", "expected"),
    [
        # lower bound
        (1.5, 1.0, 60.0, 0.2, 1.0, 1.0),  # (1.5 + 0.2) / 2 = 0.85 -> 1
        (2.0, 1.5, 60.0, 0.0, 1.0, 1.5),  # 1 -> 1.5
        (2.0, 1.0, 60.0, 1.0, 4.0, 1.125),  # target 0.25: (2 + 0.25) / 2, not clamped
        (2.0, 1.2, 60.0, 1.0, 4.0, 1.2),  # same, clamped
        # upper bound
        (5.0, 0.0, 10.0, 30.0, 1.0, 10.0),  # target 30 -> 10
        (5.0, 0.0, 10.0, 30.0, 2.0, 10.0),  # target 15 -> 10
        (5.0, 0.0, 10.0, 18.0, 2.0, 9.0),  # target 9 > (5 + 9) / 2: not clamped
        (5.0, 0.0, 10.0, 20.0, 2.0, 10.0),  # target 10 == max: exactly at the bound
        (5.0, 0.0, 10.0, 100.0, 0.5, 10.0),  # target 200 -> 10
        # min == max pins the delay
        (2.0, 2.0, 2.0, 0.0, 1.0, 2.0),
        (2.0, 2.0, 2.0, 50.0, 1.0, 2.0),
    ],
)
def test_clamping(
    start: float,
    min_delay: float,
    max_delay: float,
    latency: float,
    target_concurrency: float,
    expected: float,
    strict: bool,
) -> None:
    throttle = make(
        start,
        min_delay=min_delay,
        max_delay=max_delay,
        target_concurrency=target_concurrency,
        strict=strict,
    )
    throttle.observe(KEY, latency=latency, status=200)
    assert throttle.slot(KEY).delay == pytest.approx(expected, rel=1e-12)
    assert min_delay <= throttle.slot(KEY).delay <= max_delay


def test_a_huge_latency_stays_at_max_delay(strict: bool) -> None:
    throttle = make(5.0, max_delay=60.0, strict=strict)
    for _ in range(3):
        throttle.observe(KEY, latency=1e9, status=200)
        assert throttle.slot(KEY).delay == 60.0


# -- the non-200 rule -------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "latency", "status", "max_delay", "expected"),
    [
        # would lower (to 3.0 with a 200): kept
        (5.0, 1.0, 500, 60.0, 5.0),
        (5.0, 1.0, 404, 60.0, 5.0),
        (5.0, 1.0, 201, 60.0, 5.0),  # any status other than 200, even a 2xx
        (5.0, 1.0, 204, 60.0, 5.0),
        (5.0, 1.0, 304, 60.0, 5.0),
        (5.0, 1.0, 302, 60.0, 5.0),
        (5.0, 0.0, 500, 60.0, 5.0),  # zero latency would halve it
        # equality: the computed delay is the current one
        (5.0, 5.0, 500, 60.0, 5.0),
        (5.0, 5.0, 201, 60.0, 5.0),
        # may raise
        (5.0, 12.0, 500, 60.0, 12.0),  # target 12 > 8.5
        (5.0, 12.0, 404, 60.0, 12.0),
        (5.0, 12.0, 201, 60.0, 12.0),
        (5.0, 100.0, 500, 60.0, 60.0),  # raised, clamped at max_delay
    ],
)
def test_non_200_may_raise_but_never_lower(
    start: float, latency: float, status: int, max_delay: float, expected: float, strict: bool
) -> None:
    throttle = make(start, max_delay=max_delay, strict=strict)
    throttle.observe(KEY, latency=latency, status=status)
    assert throttle.slot(KEY).delay == expected


@pytest.mark.parametrize(
    ("latency", "status", "expected"),
    [
        (1.0, 429, 5.0),  # would lower to 3: kept
        (1.0, 503, 5.0),
        (0.0, 503, 5.0),
        (5.0, 429, 5.0),  # equality
        (12.0, 503, 12.0),  # raised by the averaging rule, not by a backoff factor
        (12.0, 429, 12.0),
    ],
)
def test_strict_scrapy_treats_429_and_503_as_any_non_200(
    latency: float, status: int, expected: float
) -> None:
    throttle = make(5.0, strict=True)
    throttle.observe(KEY, latency=latency, status=status)
    assert throttle.slot(KEY).delay == expected


def test_non_200_with_target_concurrency_raises_by_the_averaging_rule(strict: bool) -> None:
    # target = 12 / 2 = 6 > (5 + 6) / 2 = 5.5 -> 6
    throttle = make(5.0, target_concurrency=2.0, strict=strict)
    throttle.observe(KEY, latency=12.0, status=500)
    assert throttle.slot(KEY).delay == 6.0
    # target = 8 / 2 = 4: (6 + 4) / 2 = 5 would lower: kept at 6
    throttle.observe(KEY, latency=8.0, status=500)
    assert throttle.slot(KEY).delay == 6.0
    # the same latency with a 200 does lower it
    throttle.observe(KEY, latency=8.0, status=200)
    assert throttle.slot(KEY).delay == 5.0


@pytest.mark.parametrize("status", [500, 404, 403])
def test_a_stream_of_fast_errors_never_lowers_the_delay(status: int, strict: bool) -> None:
    throttle = make(5.0, strict=strict)
    for _ in range(20):
        throttle.observe(KEY, latency=0.001, status=status)
    assert throttle.slot(KEY).delay == 5.0


def test_non_200_rule_checks_the_status_not_the_status_class(strict: bool) -> None:
    # 200 lowers, 299 and 199 do not
    for status, expected in [(200, 3.0), (299, 5.0), (199, 5.0)]:
        throttle = make(5.0, strict=strict)
        throttle.observe(KEY, latency=1.0, status=status)
        assert throttle.slot(KEY).delay == expected, status


def test_observe_records_the_response_in_the_snapshot(strict: bool) -> None:
    throttle = make(5.0, strict=strict)
    throttle.observe(KEY, latency=1.0, status=200)
    throttle.observe(KEY, latency=2.5, status=500)
    throttle.observe(KEY, latency=0.5, status=500)
    snap = throttle.snapshot()[KEY]
    assert snap.last_latency == 0.5
    assert snap.responses == 3
    assert dict(snap.status_counts) == {200: 1, 500: 2}
    assert snap.delay == 3.0  # 5 -> 3 (200); the 500s would only lower it


# -- invalid samples --------------------------------------------------------------


@pytest.mark.parametrize(
    ("latency", "error"),
    [
        (-1.0, ValueError),
        (-0.001, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        ("1.0", TypeError),
        (None, TypeError),
        (True, TypeError),
        ([1.0], TypeError),
    ],
)
def test_invalid_latency_raises_naming_latency(
    latency: object, error: type[Exception], strict: bool
) -> None:
    throttle = make(5.0, strict=strict)
    with pytest.raises(error) as info:
        throttle.observe(KEY, latency=latency, status=200)  # type: ignore[arg-type]
    message = str(info.value)
    assert "latency" in message
    assert repr(latency) in message
    # nothing was applied
    snap = throttle.snapshot()[KEY]
    assert snap.delay == 5.0
    assert snap.responses == 0
    assert snap.last_latency is None


@pytest.mark.parametrize("status", ["200", 200.0, None, True, False, b"200"])
def test_invalid_status_raises_naming_status(status: object, strict: bool) -> None:
    throttle = make(5.0, strict=strict)
    with pytest.raises(TypeError) as info:
        throttle.observe(KEY, latency=1.0, status=status)  # type: ignore[arg-type]
    message = str(info.value)
    assert "status" in message
    assert repr(status) in message
    snap = throttle.snapshot()[KEY]
    assert snap.delay == 5.0
    assert snap.responses == 0
    assert dict(snap.status_counts) == {}


@pytest.mark.parametrize("key", ["", None, 5, b"example.com"])
def test_observe_rejects_a_bad_key(key: object) -> None:
    throttle = make(5.0)
    with pytest.raises(TypeError) as info:
        throttle.observe(key, latency=1.0, status=200)  # type: ignore[arg-type]
    assert "key" in str(info.value)
    assert repr(key) in str(info.value)
