"""The rate-limit dialects beyond the IETF drafts, several windows at once, and
cache hits an adapter reports: parsed from real-looking responses, hostile
variants ignored, and each shown pacing a throttle.

Pacing is tested on an injected :class:`FakeClock` (its wall clock beside it)
with ``try_acquire``: a slot is closed while it returns None, open once it
returns a lease. Expected numbers come from docs/signals.md ("Header
dialects", "Several windows", "Rate-limit headers"): sends a window's own pace
apart (``window / limit``, exactly: the arrival guard keeps the margin), a
pause until the reset when nothing remains.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autothrottle import Throttle
from autothrottle._headers import read_headers
from autothrottle._state import SlotState
from autothrottle.store import RateLimit
from helpers import WALL, FakeClock

NOW = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT
KEY = "api.example"
MARGIN = 1.0  # sends at a window's own pace, exactly (a fake clock has no timing noise)
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def budget_of(headers: Mapping[str, str], *, now: float) -> RateLimit | None:
    """The budget a 200 with ``headers`` advertises."""
    return read_headers(200, headers, now=now).rate_limit


def fake(**kwargs: Any) -> tuple[FakeClock, Throttle]:
    clock = FakeClock()
    kwargs.setdefault("start_delay", 0.0)
    return clock, Throttle(clock=clock, wall_clock=clock.wall, **kwargs)


def respond(throttle: Throttle, headers: Mapping[str, str], status: int = 200) -> None:
    """Send one request now (the slot must be open) and observe its response."""
    lease = throttle.try_acquire(KEY)
    assert lease is not None, "the slot is closed"
    lease.observe(latency=0.0, status=status, headers=headers)
    lease.release()


def closed_for(throttle: Throttle, clock: FakeClock, seconds: float) -> None:
    """The slot stays closed for ``seconds`` from now, and is open right after."""
    start = clock.now
    clock.now = start + seconds - 0.001
    assert throttle.try_acquire(KEY) is None, f"open before {seconds} s"
    clock.now = start + seconds + 1e-9
    lease = throttle.try_acquire(KEY)
    assert lease is not None, f"closed after {seconds} s"
    lease.release()


def rfc3339(moment: float, offset_minutes: int = 0) -> str:
    zone = timezone(timedelta(minutes=offset_minutes))
    text = datetime.fromtimestamp(moment, tz=UTC).astimezone(zone).isoformat()
    return text.replace("+00:00", "Z")


# =================================================================================
# each dialect, from a real-looking response
# =================================================================================


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # Reddit: a fractional remaining, a used count, a reset in seconds.
        (
            {"x-ratelimit-remaining": "598.0", "x-ratelimit-used": "2", "x-ratelimit-reset": "412"},
            RateLimit(598, 412.0, 600, "X-RateLimit-*"),
        ),
        (
            {"x-ratelimit-remaining": "0.0", "x-ratelimit-used": "600", "x-ratelimit-reset": "2"},
            RateLimit(0, 2.0, 600, "X-RateLimit-*"),
        ),
        # GitHub sends used and limit: the limit is taken as said.
        (
            {
                "x-ratelimit-limit": "5000",
                "x-ratelimit-remaining": "4990",
                "x-ratelimit-used": "7",
                "x-ratelimit-reset": "1700003600",
                "x-ratelimit-resource": "core",
            },
            RateLimit(4990, 3600.0, 5000, "X-RateLimit-*"),
        ),
        # OpenAI: the requests dimension, resets as Go durations; tokens ignored.
        (
            {
                "x-ratelimit-limit-requests": "10000",
                "x-ratelimit-remaining-requests": "9999",
                "x-ratelimit-reset-requests": "6m0s",
                "x-ratelimit-limit-tokens": "1000000",
                "x-ratelimit-remaining-tokens": "999000",
                "x-ratelimit-reset-tokens": "60ms",
            },
            RateLimit(9999, 360.0, 10000, "X-RateLimit-*-Requests"),
        ),
        # Anthropic: RFC 3339 resets on the wall clock.
        (
            {
                "anthropic-ratelimit-requests-limit": "50",
                "anthropic-ratelimit-requests-remaining": "49",
                "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:21Z",
                "anthropic-ratelimit-tokens-remaining": "39000",
            },
            RateLimit(49, 1.0, 50, "Anthropic-RateLimit-Requests-*"),
        ),
        # Shopify: a leaky bucket, used/limit, 20 s to drain.
        (
            {"X-Shopify-Shop-Api-Call-Limit": "32/40"},
            RateLimit(8, 0.0, 40, "X-Shopify-Shop-Api-Call-Limit", window=20.0),
        ),
        (
            {"X-Shopify-Shop-Api-Call-Limit": "40/40"},
            RateLimit(0, 0.5, 40, "X-Shopify-Shop-Api-Call-Limit", window=20.0),
        ),
        (
            {"X-Shopify-Shop-Api-Call-Limit": "39/40, 39/40"},  # repeated, joined
            RateLimit(1, 0.0, 40, "X-Shopify-Shop-Api-Call-Limit", window=20.0),
        ),
        (
            {"x-shopify-shop-api-call-limit": "400/400"},  # Plus: 20 a second
            RateLimit(0, 0.05, 400, "X-Shopify-Shop-Api-Call-Limit", window=20.0),
        ),
        # Twitter/X and Okta: x-rate-limit-*, epoch seconds.
        (
            {
                "x-rate-limit-limit": "900",
                "x-rate-limit-remaining": "899",
                "x-rate-limit-reset": "1700000900",
            },
            RateLimit(899, 900.0, 900, "X-Rate-Limit-*"),
        ),
        # Atlassian: X-RateLimit-Reset as an RFC 3339 timestamp.
        (
            {"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "2023-11-14T23:13:50+01:00"},
            RateLimit(3, 30.0, None, "X-RateLimit-*"),
        ),
    ],
    ids=[
        "reddit",
        "reddit-spent",
        "github-used",
        "openai",
        "anthropic",
        "shopify",
        "shopify-full",
        "shopify-repeated",
        "shopify-plus",
        "x",
        "atlassian",
    ],
)
def test_dialect(headers: dict[str, str], expected: RateLimit) -> None:
    assert budget_of(headers, now=NOW) == expected


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("6m0s", 360.0),
        ("1s", 1.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("2m59.56s", 179.56),
        ("0s", 0.0),
        ("1.5\u00b5s", 1.5e-6),
        ("7.66s", 7.66),
        ("0", 0.0),  # Go prints a zero duration as "0s", but a bare 0 is plain
        ("12", 12.0),  # plain seconds are tolerated
    ],
)
def test_openai_go_duration_resets(value: str, seconds: float) -> None:
    headers = {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": value}
    budget = budget_of(headers, now=NOW)
    assert budget is not None
    assert budget.reset == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2023-11-14T22:13:22Z", 2.0),
        ("2023-11-14T22:13:20.25Z", 0.25),
        ("2023-11-14t22:13:30z", 10.0),
        ("2023-11-14 22:13:30Z", 10.0),
        ("2023-11-14T17:13:25-05:00", 5.0),
        ("2023-11-14T22:13:20.123456789Z", 0.123456789),
        ("2023-11-14T22:13:19Z", 0.0),  # past
        ("2020-01-01T00:00:00Z", 0.0),
    ],
)
def test_anthropic_rfc3339_resets(value: str, seconds: float) -> None:
    headers = {
        "anthropic-ratelimit-requests-remaining": "1",
        "anthropic-ratelimit-requests-reset": value,
    }
    budget = budget_of(headers, now=NOW)
    assert budget is not None
    assert budget.reset == pytest.approx(seconds, abs=1e-6)


@pytest.mark.parametrize(
    "headers",
    [
        {"x-ratelimit-remaining-tokens": "10", "x-ratelimit-reset-tokens": "1s"},  # tokens only
        {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "6x"},
        {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "-1s"},
        {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "1s" * 40},
        {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "s"},
        {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "1h1"},
        {"x-ratelimit-remaining-requests": "-5", "x-ratelimit-reset-requests": "1s"},
        {
            "anthropic-ratelimit-requests-remaining": "1",
            "anthropic-ratelimit-requests-reset": "2023-13-14T22:13:22Z",
        },
        {
            "anthropic-ratelimit-requests-remaining": "1",
            "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:22+24:00",
        },
        {
            "anthropic-ratelimit-requests-remaining": "1",
            "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:22",  # no zone
        },
        {
            "anthropic-ratelimit-requests-remaining": "1",
            "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:61Z",
        },
        {"anthropic-ratelimit-requests-remaining": "1"},  # no reset
        {"X-Shopify-Shop-Api-Call-Limit": "32"},
        {"X-Shopify-Shop-Api-Call-Limit": "32/0"},
        {"X-Shopify-Shop-Api-Call-Limit": "-1/40"},
        {"X-Shopify-Shop-Api-Call-Limit": "a/b"},
        {"X-Shopify-Shop-Api-Call-Limit": "/"},
        {"x-rate-limit-remaining": "lots", "x-rate-limit-reset": "1700000900"},
        {"x-ratelimit-remaining": "598.0", "x-ratelimit-used": "2"},  # no reset
        {"x-ratelimit-remaining": "598.0.0", "x-ratelimit-reset": "5"},
        {"X-App-Rate-Limit": "20:1,garbage"},
        {"X-RateLimit-Remaining-Minute": "many"},
    ],
)
def test_dialect_garbage_is_ignored_and_noted(headers: dict[str, str]) -> None:
    assert budget_of(headers, now=NOW) is None
    signals = read_headers(200, headers, now=NOW)
    assert signals.rate_limit is None
    tokens_only = all("tokens" in name for name in headers)
    assert bool(signals.ignored) is not tokens_only  # tokens are not read, so not noted


def test_a_bad_used_count_keeps_the_budget_without_a_limit() -> None:
    headers = {"x-ratelimit-remaining": "5", "x-ratelimit-used": "x", "x-ratelimit-reset": "9"}
    signals = read_headers(200, headers, now=NOW)
    assert signals.rate_limit == RateLimit(5, 9.0, None, "X-RateLimit-*")
    assert signals.ignored == ("X-RateLimit-Used 'x': not a count",)


# =================================================================================
# several windows at once
# =================================================================================


def test_etsy_per_second_and_per_day_bind_by_the_day() -> None:
    headers = {
        "x-limit-per-second": "10",
        "x-remaining-this-second": "9",
        "x-limit-per-day": "10000",
        "x-remaining-today": "9000",
    }
    budget = budget_of(headers, now=NOW)
    second = RateLimit(9, 1.0, 10, "X-Limit-Per-Second", "second", 1.0)
    day = RateLimit(9000, 86400.0, 10000, "X-Limit-Per-Day", "day", 86400.0)
    assert budget == RateLimit(
        9000, 86400.0, 10000, "X-Limit-Per-Day", "day", 86400.0, windows=(second, day)
    )
    assert budget.slowest == day


def test_kong_per_unit_windows_join_its_ratelimit_fields() -> None:
    """Kong sends the binding window as RateLimit-* and every window per unit."""
    headers = {
        "RateLimit-Limit": "5",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "1",
        "X-RateLimit-Limit-Second": "5",
        "X-RateLimit-Remaining-Second": "0",
        "X-RateLimit-Limit-Hour": "1000",
        "X-RateLimit-Remaining-Hour": "990",
    }
    budget = budget_of(headers, now=NOW)
    assert budget is not None
    # The exhausted one binds; the per-second copy gave it its window, once.
    assert (budget.remaining, budget.reset, budget.source, budget.window) == (
        0,
        1.0,
        "RateLimit-*",
        1.0,
    )
    assert [w.source for w in budget.windows] == ["RateLimit-*", "X-RateLimit-*-Hour"]
    assert budget.slowest.sustained == pytest.approx(3.6)


def test_riot_app_and_method_windows() -> None:
    headers = {
        "X-App-Rate-Limit": "20:1,100:120",
        "X-App-Rate-Limit-Count": "1:1,60:120",
        "X-Method-Rate-Limit": "2000:60",
        "X-Method-Rate-Limit-Count": "3:60",
    }
    budget = budget_of(headers, now=NOW)
    assert budget is not None
    assert [(w.policy, w.remaining, w.limit) for w in budget.windows] == [
        ("1s", 19, 20),
        ("120s", 40, 100),
        ("60s", 1997, 2000),
    ]
    # 40 left over 120 s (3 s apart) binds: 19 over 1 s is a short burst.
    assert (budget.policy, budget.spacing) == ("120s", 3.0)


def test_ietf_policies_bind_by_their_own_pace_when_t_is_zero() -> None:
    headers = {
        "RateLimit": '"burst";r=9;t=0, "hour";r=500;t=0',
        "RateLimit-Policy": '"burst";q=10;w=1, "hour";q=1000;w=3600',
    }
    budget = budget_of(headers, now=NOW)
    assert budget is not None
    assert budget.policy == "hour"  # 3.6 s apart beats 0.1 s, though t says 0 for both
    assert len(budget.windows) == 2


@PROPERTY
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=1000),  # remaining
            st.integers(min_value=0, max_value=10_000),  # reset
            st.integers(min_value=1, max_value=10_000),  # quota
            st.integers(min_value=1, max_value=100_000),  # window
        ),
        min_size=2,
        max_size=6,
    )
)
def test_property_the_binding_window_holds_sends_back_the_most(
    policies: list[tuple[int, int, int, int]],
) -> None:
    field = ", ".join(f'"p{i}";r={r};t={t}' for i, (r, t, _, _) in enumerate(policies))
    policy = ", ".join(f'"p{i}";q={q};w={w}' for i, (_, _, q, w) in enumerate(policies))
    budget = budget_of({"RateLimit": field, "RateLimit-Policy": policy}, now=NOW)
    assert budget is not None
    assert len(budget.windows) == len(policies)
    assert all(not w.windows for w in budget.windows)
    assert any(
        (w.remaining, w.reset, w.policy) == (budget.remaining, budget.reset, budget.policy)
        for w in budget.windows
    )
    exhausted = [t for r, t, _, _ in policies if r == 0]
    if exhausted:
        assert (budget.remaining, budget.reset) == (0, max(exhausted))
    else:
        gap = max(max(t / r, w / q) for r, t, q, w in policies)
        assert max(budget.spacing, budget.sustained or 0.0) == pytest.approx(gap)
    assert budget.slowest.sustained == pytest.approx(max(w / q for _, _, q, w in policies))


# =================================================================================
# properties of each dialect
# =================================================================================


@PROPERTY
@given(
    st.integers(min_value=0, max_value=99),
    st.integers(min_value=0, max_value=59),
    st.integers(min_value=0, max_value=59),
    st.integers(min_value=0, max_value=999),
)
def test_property_go_durations(hours: int, minutes: int, seconds: int, millis: int) -> None:
    text = "".join(
        f"{value}{unit}"
        for value, unit in ((hours, "h"), (minutes, "m"), (seconds, "s"), (millis, "ms"))
        if value
    )
    text = text or "0s"
    headers = {"x-ratelimit-remaining-requests": "1", "x-ratelimit-reset-requests": text}
    budget = budget_of(headers, now=NOW)
    assert budget is not None
    expected = hours * 3600 + minutes * 60 + seconds + millis / 1000
    assert budget.reset == pytest.approx(expected)


@PROPERTY
@given(
    st.integers(min_value=0, max_value=20 * 365 * 86400),
    st.integers(min_value=-23 * 60, max_value=23 * 60),
)
def test_property_rfc3339_round_trip(ahead: int, offset: int) -> None:
    headers = {
        "anthropic-ratelimit-requests-remaining": "1",
        "anthropic-ratelimit-requests-reset": rfc3339(NOW + ahead, offset),
    }
    budget = budget_of(headers, now=NOW)
    assert budget is not None
    assert budget.reset == pytest.approx(float(ahead))


@PROPERTY
@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=9))
def test_property_fractional_counts_round_down(whole: int, tenth: int) -> None:
    headers = {"x-ratelimit-remaining": f"{whole}.{tenth}", "x-ratelimit-reset": "60"}
    budget = budget_of(headers, now=NOW)
    assert budget is not None
    assert budget.remaining == whole


@PROPERTY
@given(st.integers(min_value=0, max_value=1000), st.integers(min_value=1, max_value=1000))
def test_property_shopify_bucket(used: int, limit: int) -> None:
    headers = {"X-Shopify-Shop-Api-Call-Limit": f"{used}/{limit}"}
    budget = budget_of(headers, now=NOW)
    assert budget is not None
    assert budget.remaining == max(0, limit - used)
    assert budget.sustained == pytest.approx(20.0 / limit)
    assert budget.reset == (0.0 if used < limit else pytest.approx(20.0 / limit))


_NEW_NAMES = [
    "x-ratelimit-used",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "x-rate-limit-limit",
    "x-rate-limit-remaining",
    "x-rate-limit-reset",
    "x-shopify-shop-api-call-limit",
    "x-ratelimit-limit-minute",
    "x-ratelimit-remaining-minute",
    "x-limit-per-day",
    "x-remaining-today",
    "x-app-rate-limit",
    "x-app-rate-limit-count",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
]
_NEAR = st.one_of(
    st.from_regex(r"\A[-+]?[0-9]{0,25}(\.[0-9]{0,12})?\Z"),
    st.from_regex(r"\A([0-9]{0,20}(\.[0-9]{0,9})?(h|m|s|ms|us|ns|x)){0,12}\Z"),
    st.from_regex(
        r"\A[0-9]{1,5}-[0-9]{1,2}-[0-9]{1,2}[Tt ][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}"
        r"(\.[0-9]{0,12})?(Z|[+-][0-9]{1,2}:[0-9]{1,2})?\Z"
    ),
    st.from_regex(r"\A(-?[0-9]{0,20}[:/]-?[0-9]{0,20},?){0,40}\Z"),
    st.text(max_size=200),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
)


@PROPERTY
@given(st.dictionaries(st.sampled_from(_NEW_NAMES), _NEAR, max_size=8), st.floats(0, 4e9))
def test_property_hostile_dialect_values_never_give_a_bad_budget(
    headers: dict[str, str], now: float
) -> None:
    signals = read_headers(200, headers, now=now)
    for note in signals.ignored:
        assert len(note) < 200
    budget = signals.rate_limit
    if budget is None:
        return
    for window in (budget, *budget.windows):
        assert isinstance(window.remaining, int)
        assert 0 <= window.remaining <= 10**15
        assert window.limit is None or 0 <= window.limit <= 10**15
        assert math.isfinite(window.reset)
        assert window.reset >= 0.0
        assert math.isfinite(window.spacing)
        assert window.sustained is None or math.isfinite(window.sustained)
    assert budget.windows == () or len(budget.windows) >= 2


# =================================================================================
# the pacing each dialect gives a throttle
# =================================================================================


def _at(moment: float) -> str:
    return str(int(moment))


@pytest.mark.parametrize(
    "make",
    [
        lambda wall: {
            "x-ratelimit-remaining": "0.0",
            "x-ratelimit-used": "600",
            "x-ratelimit-reset": "2",
        },
        lambda wall: {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "2s",
        },
        lambda wall: {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": rfc3339(wall + 2.0),
        },
        lambda wall: {
            "x-rate-limit-limit": "900",
            "x-rate-limit-remaining": "0",
            "x-rate-limit-reset": _at(wall + 2.0),
        },
        lambda wall: {"X-Remaining-This-Second": "5", "X-Remaining-Today": "0"},
    ],
    ids=["reddit", "openai", "anthropic", "x", "etsy-day-spent"],
)
def test_an_exhausted_dialect_closes_the_slot_until_its_reset(make: Any) -> None:
    clock, throttle = fake()
    respond(throttle, make(clock.wall()))
    snap = throttle.slot(KEY).snapshot()
    assert snap.rate_limit is not None
    reset = snap.rate_limit.reset
    assert reset == pytest.approx(2.0 if reset < 10 else 86400.0)
    closed_for(throttle, clock, min(reset, 300.0))  # max_pause caps a day's wait


def test_openai_spreads_what_remains_until_the_reset() -> None:
    clock, throttle = fake()
    respond(
        throttle,
        {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "4",
            "x-ratelimit-reset-requests": "2s",
        },
    )
    closed_for(throttle, clock, 0.25)  # (2 s less the second it may be rounded by) / 4


def test_shopify_paces_at_the_leak_rate_and_waits_out_a_full_bucket() -> None:
    clock, throttle = fake()
    respond(throttle, {"X-Shopify-Shop-Api-Call-Limit": "32/40"})
    closed_for(throttle, clock, 0.5 * MARGIN)  # 2 a second leak out
    clock, throttle = fake()
    respond(throttle, {"X-Shopify-Shop-Api-Call-Limit": "40/40"})
    closed_for(throttle, clock, 0.5)  # one request's room leaks out


@pytest.mark.parametrize(
    ("headers", "gap"),
    [
        (
            {
                "X-Limit-Per-Second": "10",
                "X-Remaining-This-Second": "9",
                "X-Limit-Per-Day": "1000000",
                "X-Remaining-Today": "1000000",
            },
            0.1 * MARGIN,  # a million a day is looser than 10 a second: the second binds
        ),
        (
            {
                "RateLimit": '"burst";r=9;t=0, "hour";r=999;t=0',
                "RateLimit-Policy": '"burst";q=10;w=1, "hour";q=1000;w=3600',
            },
            3.6 * MARGIN,
        ),
        (
            {
                "X-RateLimit-Limit-Second": "10",
                "X-RateLimit-Remaining-Second": "1",
                "X-RateLimit-Limit-Minute": "120",
                "X-RateLimit-Remaining-Minute": "100",
            },
            # The second binds, but its reset is unknown (at most 1 s, maybe
            # now): its last request fits within the minute's pace, 0.5 s.
            0.5 * MARGIN,
        ),
    ],
    ids=["etsy", "ietf", "kong"],
)
def test_several_windows_pace_at_the_binding_one(headers: dict[str, str], gap: float) -> None:
    clock, throttle = fake()
    respond(throttle, headers)
    closed_for(throttle, clock, gap)


def test_several_windows_keep_the_slowest_long_run_pace() -> None:
    """The burst window binds until its reset; the minute's pace holds past it."""
    clock, throttle = fake()
    respond(
        throttle,
        {
            "RateLimit": '"burst";r=1;t=2.5, "minute";r=50;t=0',
            "RateLimit-Policy": '"burst";q=10;w=1, "minute";q=100;w=60',
        },
    )
    closed_for(throttle, clock, 2.5)  # 1 left over 2.5 s
    closed_for(throttle, clock, 0.6 * MARGIN)  # 100 a minute, though t=0


def test_an_unchanged_throttle_reads_the_old_dialects_too() -> None:
    """GitHub's X-RateLimit-* with an epoch reset still closes the slot."""
    clock, throttle = fake()
    reset = _at(clock.wall() + 3.0)
    respond(
        throttle,
        {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset},
    )
    closed_for(throttle, clock, 3.0)


# =================================================================================
# cache hits an adapter reports
# =================================================================================


STALE_BUDGET = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "20"}


def _snap_after(headers: Mapping[str, str], from_cache: bool | None) -> Any:
    clock, throttle = fake(start_delay=1.0)
    for latency in (0.8, 0.8):  # misses: the origin's latency is known
        clock.advance(2.0)
        lease = throttle.try_acquire(KEY)
        assert lease is not None
        lease.observe(latency=latency, status=200)
        lease.release()
    clock.advance(2.0)
    lease = throttle.try_acquire(KEY)
    assert lease is not None
    lease.observe(latency=0.001, status=200, headers=headers, from_cache=from_cache)
    lease.release()
    return throttle.slot(KEY).snapshot()


def test_from_cache_is_a_cache_hit_exactly_as_a_header_says() -> None:
    by_header = _snap_after({"X-Cache": "HIT", **STALE_BUDGET}, None)
    by_adapter = _snap_after(STALE_BUDGET, True)
    missed = _snap_after(STALE_BUDGET, None)
    assert by_adapter.cache_hits == by_header.cache_hits == 1
    assert by_adapter.delay == by_header.delay
    assert by_adapter.rate_limit is None  # the stored budget is stale
    assert by_adapter.pause_remaining == 0.0
    # Without the marker the fast response is a miss: it lowers the delay and
    # its stale budget pauses the slot.
    assert missed.cache_hits == 0
    assert missed.delay < by_adapter.delay
    assert missed.pause_remaining == pytest.approx(20.0)


def test_from_cache_false_leaves_it_to_the_headers() -> None:
    assert _snap_after({"Age": "30"}, False).cache_hits == 1
    assert _snap_after({}, False).cache_hits == 0


def test_throttle_observe_takes_from_cache() -> None:
    _, throttle = fake()
    throttle.observe(KEY, latency=0.0, status=200, from_cache=True)
    assert throttle.slot(KEY).snapshot().cache_hits == 1


def test_from_cache_counts_in_strict_mode_as_any_response() -> None:
    _, throttle = fake(strict_scrapy=True)
    throttle.observe(KEY, latency=0.0, status=200, from_cache=True)
    assert throttle.slot(KEY).snapshot().cache_hits == 1


@pytest.mark.parametrize("bad", ["yes", 1, 0.0])
def test_from_cache_must_be_a_bool(bad: Any) -> None:
    _, throttle = fake()
    with pytest.raises(TypeError, match=f"from_cache must be a bool or None, got {bad!r}"):
        throttle.observe(KEY, latency=0.0, status=200, from_cache=bad)


# =================================================================================
# logging hygiene and records
# =================================================================================


@pytest.mark.parametrize(
    "bad",
    [
        lambda i: {"X-Shopify-Shop-Api-Call-Limit": f"{i}/x"},
        lambda i: {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": f"{i}q"},
        lambda i: {
            "anthropic-ratelimit-requests-remaining": "5",
            "anthropic-ratelimit-requests-reset": f"2023-11-14T22:{i:02d}:99Z",
        },
        lambda i: {"x-ratelimit-remaining": f"{i}.0.0", "x-ratelimit-reset": "5"},
    ],
    ids=["shopify", "openai", "anthropic", "reddit"],
)
def test_a_bad_value_that_changes_each_time_logs_info_once_per_slot(
    bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _, throttle = fake()
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        for i in range(40):
            throttle.observe(KEY, latency=0.0, status=200, headers=bad(i))
        throttle.observe("other.example", latency=0.0, status=200, headers=bad(50))
    levels = [r.levelno for r in caplog.records if "not" in r.getMessage()]
    assert levels == [logging.INFO] + [logging.DEBUG] * 39 + [logging.INFO]


def test_valid_reddit_headers_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    _, throttle = fake()
    headers = {
        "x-ratelimit-remaining": "598.0",
        "x-ratelimit-used": "2",
        "x-ratelimit-reset": "412",
    }
    with caplog.at_level(logging.DEBUG, logger="autothrottle"):
        throttle.observe(KEY, latency=0.0, status=200, headers=headers)
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


def test_a_budget_with_windows_survives_a_json_round_trip() -> None:
    budget = budget_of(
        {"X-Limit-Per-Second": "10", "X-Remaining-This-Second": "9", "X-Remaining-Today": "5"},
        now=NOW,
    )
    assert budget is not None and len(budget.windows) == 2
    state = SlotState(delay=1.0, rate_limit=budget)
    data = json.loads(json.dumps(state.to_dict(now=100.0)))
    assert SlotState.from_dict(data, now=100.0).rate_limit == budget
    # Records written before windows existed still load.
    old = {"remaining": 1, "reset": 2.0, "limit": None, "source": "RateLimit"}
    assert RateLimit.from_dict(old) == RateLimit(1, 2.0)


def test_wall_clock_is_what_turns_an_rfc3339_reset_into_a_wait() -> None:
    clock, throttle = fake()
    later = datetime.fromtimestamp(WALL + clock.now + 4.0, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    respond(
        throttle,
        {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": later,
        },
    )
    closed_for(throttle, clock, 4.0)


# -- token windows (the LLM APIs) -----------------------------------------------------


def test_openai_token_window_beside_the_requests_budget() -> None:
    signals = read_headers(
        200,
        {
            "x-ratelimit-limit-requests": "10000",
            "x-ratelimit-remaining-requests": "9999",
            "x-ratelimit-reset-requests": "6m0s",
            "x-ratelimit-limit-tokens": "1000000",
            "x-ratelimit-remaining-tokens": "999000",
            "x-ratelimit-reset-tokens": "60ms",
        },
        now=NOW,
    )
    # The requests budget is what it always was; the tokens are a window of their own.
    assert signals.rate_limit == RateLimit(9999, 360.0, 10000, "X-RateLimit-*-Requests")
    assert signals.tokens == (
        RateLimit(999000, 0.06, 1000000, "X-RateLimit-*-Tokens", unit="tokens"),
    )
    assert signals.ignored == ()


def test_anthropic_input_and_output_token_windows() -> None:
    signals = read_headers(
        200,
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:21Z",
            "anthropic-ratelimit-tokens-limit": "8000",
            "anthropic-ratelimit-tokens-remaining": "7000",
            "anthropic-ratelimit-tokens-reset": "2023-11-14T22:13:28Z",
            "anthropic-ratelimit-input-tokens-limit": "30000",
            "anthropic-ratelimit-input-tokens-remaining": "29000",
            "anthropic-ratelimit-input-tokens-reset": "2023-11-14T22:13:22Z",
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "7000",
            "anthropic-ratelimit-output-tokens-reset": "2023-11-14T22:13:28Z",
        },
        now=NOW,
    )
    assert signals.rate_limit == RateLimit(49, 1.0, 50, "Anthropic-RateLimit-Requests-*")
    # The combined window is the stricter of the two others, not a third limit:
    # charging a request to it as well would count its tokens twice.
    assert signals.tokens == (
        RateLimit(29000, 2.0, 30000, "Anthropic-RateLimit-Input-Tokens-*", unit="input-tokens"),
        RateLimit(7000, 8.0, 8000, "Anthropic-RateLimit-Output-Tokens-*", unit="output-tokens"),
    )


def test_anthropic_combined_token_window_alone_is_read() -> None:
    signals = read_headers(
        200,
        {
            "anthropic-ratelimit-tokens-limit": "40000",
            "anthropic-ratelimit-tokens-remaining": "0",
            "anthropic-ratelimit-tokens-reset": "2023-11-14T22:13:50Z",
        },
        now=NOW,
    )
    assert signals.rate_limit is None
    assert signals.tokens == (
        RateLimit(0, 30.0, 40000, "Anthropic-RateLimit-Tokens-*", unit="tokens"),
    )


@pytest.mark.parametrize(
    ("headers", "note"),
    [
        (
            {"x-ratelimit-remaining-tokens": "lots", "x-ratelimit-reset-tokens": "1s"},
            "X-RateLimit-Remaining-Tokens 'lots': not a count",
        ),
        (
            {"x-ratelimit-remaining-tokens": "10", "x-ratelimit-reset-tokens": "-1s"},
            "X-RateLimit-Reset-Tokens '-1s': not a time",
        ),
        (
            {"x-ratelimit-remaining-tokens": "10"},
            "X-RateLimit-*-Tokens: remaining without a reset",
        ),
        (
            {
                "anthropic-ratelimit-output-tokens-remaining": "5",
                "anthropic-ratelimit-output-tokens-reset": "tomorrow",
            },
            "Anthropic-RateLimit-Output-Tokens-Reset 'tomorrow': not a time",
        ),
    ],
)
def test_a_bad_token_window_is_ignored_and_noted(headers: dict[str, str], note: str) -> None:
    signals = read_headers(200, headers, now=NOW)
    assert signals.tokens == ()
    assert signals.ignored == (note,)


def test_token_windows_of_a_cached_response_are_stale() -> None:
    headers = {"Age": "3", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "9s"}
    signals = read_headers(200, headers, now=NOW)
    assert signals.tokens == ()
    assert "X-RateLimit-*-Tokens: ignored on a response a cache served" in signals.ignored


def test_a_token_window_survives_a_json_round_trip() -> None:
    window = RateLimit(5, 1.5, 10, "X-RateLimit-*-Tokens", unit="tokens")
    assert RateLimit.from_dict(window.to_dict()) == window
    old = {k: v for k, v in window.to_dict().items() if k != "unit"}  # written before units
    assert RateLimit.from_dict(old).unit == "requests"
