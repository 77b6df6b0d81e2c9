"""The response-header parsers: literal tables of each form, and properties on hostile text."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from email.utils import formatdate
from typing import Any

import httpx
import multidict
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autothrottle._headers import HeaderSignals, RateLimit, read_headers

NOW = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT


def retry_after(value: str, *, now: float) -> float | None:
    """The wait a 200 with ``Retry-After: value`` asks for."""
    return read_headers(200, {"Retry-After": value}, now=now).retry_after


def budget_of(headers: Mapping[str, str], *, now: float) -> RateLimit | None:
    """The budget a 200 with ``headers`` advertises."""
    return read_headers(200, headers, now=now).rate_limit


def cache_hit(status: int, headers: Mapping[str, str]) -> bool:
    return read_headers(status, headers, now=NOW).cache_hit


def age_of(headers: Mapping[str, str]) -> float | None:
    return read_headers(200, headers, now=NOW).age


# -- Retry-After ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        ("0", 0.0),
        ("  7\t", 7.0),
        ("007", 7.0),
        ("1.5", 1.5),
        ("120, 120", 120.0),  # a repeated header joined by the client
        ("1" + "0" * 30, 1e18),  # absurd: saturates, stays finite
        ("9" * 4000, 1e18),
        ("Tue, 14 Nov 2023 22:15:00 GMT", 100.0),  # IMF-fixdate
        ("Tuesday, 14-Nov-23 22:15:00 GMT", 100.0),  # RFC 850
        ("Tue Nov 14 22:15:00 2023", 100.0),  # asctime
        ("Tue, 14 Nov 2023 23:15:00 +0100", 100.0),  # a zone, though HTTP says GMT
        ("Tue, 14 Nov 2023 22:14:60 GMT", 99.0),  # leap second read as :59
        ("Tue, 14 Nov 2023 22:13:20 GMT", 0.0),  # exactly now
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # past
        ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),
    ],
)
def test_retry_after_valid(value: str, expected: float) -> None:
    assert retry_after(value, now=NOW) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "-5",
        "+5",
        "-0.5",
        "abc",
        "soon",
        "nan",
        "NaN",
        "inf",
        "-Infinity",
        "1e3",
        "0x10",
        "1_000",
        ".5",
        "5.",
        "1.2.3",
        "\u0661\u0662",  # Arabic-Indic digits, which int() would accept
        "\u00b2",
        "12abc",
        "Tue, 14 Nov 2023 25:15:00 GMT",  # hour 25
        "Fri, 31 Feb 2023 00:00:00 GMT",  # no such day
        "Tue, 14 Nov 99999 22:15:00 GMT",  # year beyond datetime
        "Tue, 14 Nov 2023 22:15:00 GMT" + " x" * 30,  # too long to be a date
        "1" * 5000,  # longer than any real field
        "Tue, 14 Nov 2023 22:15:00 GMT\u00e9",
    ],
)
def test_retry_after_garbage_is_none(value: str) -> None:
    assert retry_after(value, now=NOW) is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After-Ms": "20.5"}, 0.0205),
        ({"retry-after-ms": "0"}, 0.0),
        ({"retry-after-ms": "250, 250"}, 0.25),  # repeated, joined by the client
        # OpenAI sends both: the milliseconds are the finer of the two.
        ({"retry-after": "1", "retry-after-ms": "120"}, 0.12),
        ({"retry-after-ms": "9" * 40}, 1e15),  # saturates, finite
        # Unusable milliseconds fall back to Retry-After.
        ({"retry-after": "3", "retry-after-ms": "-5"}, 3.0),
        ({"retry-after": "3", "retry-after-ms": "soon"}, 3.0),
        ({"retry-after": "3", "retry-after-ms": "1" * 5000}, 3.0),
        ({"retry-after-ms": "nan"}, None),
        ({"retry-after-ms": "1e3"}, None),
    ],
)
def test_retry_after_ms(headers: dict[str, str], expected: float | None) -> None:
    assert read_headers(429, headers, now=NOW).retry_after == expected


def test_unusable_retry_after_ms_is_noted() -> None:
    signals = read_headers(429, {"retry-after-ms": "-5", "retry-after": "2"}, now=NOW)
    assert signals.ignored == ("Retry-After-Ms '-5': not milliseconds",)
    assert signals.retry_after == 2.0


@pytest.mark.parametrize("now", [math.nan, math.inf, -math.inf])
def test_retry_after_rejects_a_bad_clock(now: float) -> None:
    with pytest.raises(ValueError, match="now"):
        retry_after("5", now=now)


# -- rate limits ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # IETF draft 08+: structured list, policy gives the quota.
        (
            {"RateLimit": '"default";r=50;t=30', "RateLimit-Policy": '"default";q=100;w=60'},
            RateLimit(50, 30.0, 100, "RateLimit", "default", 60.0),
        ),
        ({"ratelimit": "default;r=0;t=12"}, RateLimit(0, 12.0, None, "RateLimit", "default")),
        # No t=: the policy window bounds the reset.
        (
            {"RateLimit": '"p";r=3', "RateLimit-Policy": '"p";q=10;w=60'},
            RateLimit(3, 60.0, 10, "RateLimit", "p", 60.0),
        ),
        # Several policies: the one demanding the widest spacing (3600/100 > 20/5).
        (
            {
                "RateLimit": '"minute";r=5;t=20, "day";r=100;t=3600',
                "RateLimit-Policy": '"minute";q=10;w=60, "day";q=1000;w=86400',
            },
            RateLimit(
                100,
                3600.0,
                1000,
                "RateLimit",
                "day",
                86400.0,
                windows=(
                    RateLimit(5, 20.0, 10, "RateLimit", "minute", 60.0),
                    RateLimit(100, 3600.0, 1000, "RateLimit", "day", 86400.0),
                ),
            ),
        ),
        # ... but an exhausted policy beats any spacing.
        (
            {"RateLimit": '"a";r=1;t=1000, "b";r=0;t=5, "c";r=0;t=2'},
            RateLimit(
                0,
                5.0,
                None,
                "RateLimit",
                "b",
                windows=(
                    RateLimit(1, 1000.0, None, "RateLimit", "a"),
                    RateLimit(0, 5.0, None, "RateLimit", "b"),
                    RateLimit(0, 2.0, None, "RateLimit", "c"),
                ),
            ),
        ),
        # Equal spacing: fewer remaining wins.
        (
            {"RateLimit": '"a";r=10;t=20, "b";r=5;t=10'},
            RateLimit(
                5,
                10.0,
                None,
                "RateLimit",
                "b",
                windows=(
                    RateLimit(10, 20.0, None, "RateLimit", "a"),
                    RateLimit(5, 10.0, None, "RateLimit", "b"),
                ),
            ),
        ),
        # A bad policy among good ones is skipped.
        (
            {"RateLimit": '"bad";r=-1;t=5, "good";r=4;t=8'},
            RateLimit(4, 8.0, None, "RateLimit", "good"),
        ),
        # Quoted names may hold separators; a pk= byte sequence holds '='.
        (
            {"RateLimit": '"a,b;c=d";r=2;t=4;pk=:cHJvamVjdDEyMw==:'},
            RateLimit(2, 4.0, None, "RateLimit", "a,b;c=d"),
        ),
        # Draft 07: a dictionary.
        (
            {"RateLimit": "limit=100, remaining=50, reset=30"},
            RateLimit(50, 30.0, 100, "RateLimit"),
        ),
        ({"RateLimit": "remaining=0, reset=9"}, RateLimit(0, 9.0, None, "RateLimit")),
        # Older drafts: separate fields; the limit may carry its window.
        (
            {"RateLimit-Limit": "100", "RateLimit-Remaining": "7", "RateLimit-Reset": "20"},
            RateLimit(7, 20.0, 100, "RateLimit-*"),
        ),
        (
            {"RateLimit-Limit": "10;w=1, 50;w=60", "RateLimit-Remaining": "3"},
            RateLimit(3, 1.0, 10, "RateLimit-*", window=1.0),
        ),
        (
            {"ratelimit-remaining": "0", "ratelimit-reset": "0"},
            RateLimit(0, 0.0, None, "RateLimit-*"),
        ),
        # X-RateLimit-*: delta seconds.
        (
            {"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "59", "X-RateLimit-Reset": "60"},
            RateLimit(59, 60.0, 60, "X-RateLimit-*"),
        ),
        # ... epoch seconds (GitHub) ...
        (
            {"x-ratelimit-remaining": "5", "x-ratelimit-reset": "1700000090"},
            RateLimit(5, 90.0, None, "X-RateLimit-*"),
        ),
        # ... epoch with a fraction ...
        (
            {"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "1700000001.5"},
            RateLimit(1, 1.5, None, "X-RateLimit-*"),
        ),
        # ... epoch milliseconds ...
        (
            {"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "1700000004000"},
            RateLimit(1, 4.0, None, "X-RateLimit-*"),
        ),
        # ... an epoch in the past ...
        (
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1600000000"},
            RateLimit(0, 0.0, None, "X-RateLimit-*"),
        ),
        # ... an HTTP-date ...
        (
            {"X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "Tue, 14 Nov 2023 22:14:00 GMT"},
            RateLimit(2, 40.0, None, "X-RateLimit-*"),
        ),
        # ... and Reset-After (delta) preferred over Reset.
        (
            {
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": "1700000100",
                "X-RateLimit-Reset-After": "2.5",
            },
            RateLimit(0, 2.5, None, "X-RateLimit-*"),
        ),
        # Repeated headers joined by the client: the first value.
        (
            {"X-RateLimit-Remaining": "4, 4", "X-RateLimit-Reset": "10, 10"},
            RateLimit(4, 10.0, None, "X-RateLimit-*"),
        ),
        # Huge counts saturate.
        (
            {"X-RateLimit-Remaining": "9" * 40, "X-RateLimit-Reset": "1"},
            RateLimit(10**15, 1.0, None, "X-RateLimit-*"),
        ),
        # A fractional count (Reddit) is rounded down: half a request cannot be sent.
        (
            {"X-RateLimit-Remaining": "1.5", "X-RateLimit-Reset": "5"},
            RateLimit(1, 5.0, None, "X-RateLimit-*"),
        ),
        # A bad limit is dropped, the budget kept.
        (
            {"X-RateLimit-Limit": "lots", "X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "6"},
            RateLimit(3, 6.0, None, "X-RateLimit-*"),
        ),
    ],
)
def test_rate_limit_forms(headers: dict[str, str], expected: RateLimit) -> None:
    assert budget_of(headers, now=NOW) == expected


def test_rate_limit_precedence() -> None:
    """The IETF field beats the older fields, which beat X-RateLimit-*."""
    every = {
        "RateLimit": '"p";r=1;t=10',
        "RateLimit-Remaining": "2",
        "RateLimit-Reset": "20",
        "X-RateLimit-Remaining": "3",
        "X-RateLimit-Reset": "30",
    }
    assert budget_of(every, now=NOW) == RateLimit(1, 10.0, None, "RateLimit", "p")
    del every["RateLimit"]
    assert budget_of(every, now=NOW) == RateLimit(2, 20.0, None, "RateLimit-*")
    del every["RateLimit-Remaining"]
    assert budget_of(every, now=NOW) == RateLimit(3, 30.0, None, "X-RateLimit-*")


def test_an_invalid_family_falls_through_to_the_next() -> None:
    headers = {
        "RateLimit": "garbage",
        "RateLimit-Remaining": "-1",
        "RateLimit-Reset": "5",
        "X-RateLimit-Remaining": "8",
        "X-RateLimit-Reset": "16",
    }
    assert budget_of(headers, now=NOW) == RateLimit(8, 16.0, None, "X-RateLimit-*")


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Content-Type": "text/html"},
        {"X-RateLimit-Limit": "60"},  # a limit alone is no budget
        {"X-RateLimit-Remaining": "-1", "X-RateLimit-Reset": "5"},
        {"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "-5"},
        {"X-RateLimit-Remaining": "five", "X-RateLimit-Reset": "5"},
        {"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "nan"},
        {"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "inf"},
        {"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "1" + "0" * 20},  # no time
        {"X-RateLimit-Remaining": "5"},  # no reset, no window
        {"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "soon"},
        {"RateLimit-Remaining": "5", "RateLimit-Reset": "5" * 5000},  # too long
        {"RateLimit": '"p";t=5'},  # no remaining
        {"RateLimit": '"p";r=5'},  # no reset, no policy window
        {"RateLimit": '"p";r=5;t=-1'},
        {"RateLimit": '"p";r=5;t=1e3'},
        {"RateLimit": "limit=5, reset=3"},
        {"RateLimit": ",,,,;;;;===="},
        {"RateLimit": '"unterminated;r=1;t=2'},
    ],
)
def test_rate_limit_ignored(headers: dict[str, str]) -> None:
    assert budget_of(headers, now=NOW) is None


def test_spacing() -> None:
    assert RateLimit(4, 10.0).spacing == 2.5
    assert RateLimit(0, 10.0).spacing == 10.0
    assert RateLimit(0, 0.0).spacing == 0.0


# -- cache hits -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (200, {}, False),
        (304, {}, True),
        (200, {"Age": "5"}, True),
        (200, {"age": "0"}, False),
        (200, {"Age": "0.5"}, True),
        (200, {"Age": "-5"}, False),
        (200, {"Age": "junk"}, False),
        (200, {"X-Cache": "HIT"}, True),
        (200, {"X-Cache": "hit"}, True),
        (200, {"X-Cache": "Hit from cloudfront"}, True),
        (200, {"X-Cache": "RefreshHit from cloudfront"}, False),  # asked the origin
        (200, {"X-Cache": "Miss from cloudfront"}, False),
        (200, {"X-Cache": "MISS, HIT"}, True),  # a cache in the chain answered
        (200, {"X-Cache": "HIT, MISS"}, True),
        (200, {"X-Cache": "MISS, MISS"}, False),
        (200, {"X-Cache": "HIT-STALE"}, True),
        (200, {"X-Cache": "TCP_MEM_HIT from a1.example.net"}, True),
        (200, {"X-Cache": "TCP_REFRESH_HIT from a1.example.net"}, False),
        (200, {"X-Cache": "WHITEHIT"}, False),
        (200, {"X-Cache": ""}, False),
        (200, {"X-Cache-Status": "HIT"}, True),
        (200, {"X-Cache-Status": "STALE"}, True),
        (200, {"X-Cache-Status": "UPDATING"}, True),
        (200, {"X-Cache-Status": "REVALIDATED"}, False),
        (200, {"X-Cache-Status": "EXPIRED"}, False),
        (200, {"X-Cache-Status": "MISS"}, False),
        (200, {"X-Cache-Status": "BYPASS"}, False),
        (200, {"CF-Cache-Status": "HIT"}, True),
        (200, {"cf-cache-status": "stale"}, True),
        (200, {"CF-Cache-Status": "DYNAMIC"}, False),
        (200, {"CF-Cache-Status": "MISS"}, False),
        (200, {"Cache-Status": "ExampleCache; hit"}, True),
        (200, {"Cache-Status": "Origin; fwd=uri-miss, Edge; hit; ttl=30"}, True),
        (200, {"Cache-Status": "Edge; fwd=stale; fwd-status=200"}, False),
        (200, {"Cache-Status": "Edge; hit=?0"}, False),
        (200, {"X-Cache": "HIT" + " " * 5000}, False),  # too long: ignored
    ],
)
def test_cache_hit(status: int, headers: dict[str, str], expected: bool) -> None:
    assert cache_hit(status, headers) is expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"Age": "0"}, 0.0),
        ({"Age": "42"}, 42.0),
        ({"AGE": "42, 42"}, 42.0),
        ({"Age": "9" * 100}, 1e18),
        ({"Age": "-1"}, None),
        ({"Age": "forty"}, None),
    ],
)
def test_age_of(headers: dict[str, str], expected: float | None) -> None:
    assert age_of(headers) == expected


# -- lookup and the combined reading ----------------------------------------------


def test_names_are_matched_in_any_case_on_a_plain_dict() -> None:
    for name in ("retry-after", "RETRY-AFTER", "rEtRy-AfTeR", "Retry-After"):
        assert read_headers(200, {name: "4"}, now=NOW).retry_after == 4.0
    assert read_headers(200, {"Other": "5"}, now=NOW).retry_after is None


def test_client_header_types() -> None:
    """httpx.Headers and aiohttp's CIMultiDictProxy: the first of repeated values."""
    httpx_headers = httpx.Headers([("x-ratelimit-remaining", "3"), ("X-RateLimit-Reset", "9")])
    assert budget_of(httpx_headers, now=NOW) == RateLimit(3, 9.0, None, "X-RateLimit-*")
    raw = multidict.CIMultiDict([("Age", "7"), ("age", "0"), ("X-Cache", "MISS")])
    proxy = multidict.CIMultiDictProxy(raw)
    assert age_of(proxy) == 7.0
    assert cache_hit(200, proxy)


def test_a_name_passed_over_once_does_not_hide_the_ones_read() -> None:
    # Names the table does not read are remembered, so a response with only
    # such names costs one check; a known one beside them must still be read.
    for _ in range(3):
        assert read_headers(200, {"X-Unread-Name": "1"}, now=NOW) == HeaderSignals()
    both = {"X-Unread-Name": "1", "Retry-After": "4"}
    assert read_headers(200, both, now=NOW).retry_after == 4.0
    proxy = multidict.CIMultiDictProxy(multidict.CIMultiDict(both))
    assert read_headers(200, proxy, now=NOW).retry_after == 4.0
    assert read_headers(200, httpx.Headers(both), now=NOW).retry_after == 4.0


def test_the_names_passed_over_are_bounded() -> None:
    from autothrottle._headers import _names

    for i in range(3 * _names._PASSED_KEPT):
        read_headers(200, {f"X-Invented-{i}": "1"}, now=NOW)
    assert len(_names.PASSED) <= _names._PASSED_KEPT
    assert read_headers(200, {"X-Invented-0": "1", "Age": "5"}, now=NOW).age == 5.0
    # Full, the memory starts again: a name first seen now is still remembered.
    read_headers(200, {"X-Seen-After-The-Rest": "1"}, now=NOW)
    assert "X-Seen-After-The-Rest" in _names.PASSED


def test_read_headers_nothing_relevant() -> None:
    assert read_headers(200, {"Content-Type": "text/html"}, now=NOW) == HeaderSignals()
    assert read_headers(304, {}, now=NOW) == HeaderSignals(cache_hit=True)


def test_read_headers_everything() -> None:
    signals = read_headers(
        429,
        {
            "retry-after": "30",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": "1700000030",
            "X-Cache": "MISS",
        },
        now=NOW,
    )
    assert signals == HeaderSignals(
        cache_hit=False,
        age=None,
        retry_after=30.0,
        rate_limit=RateLimit(0, 30.0, None, "X-RateLimit-*"),
        ignored=(),
    )


def test_read_headers_drops_the_budget_of_a_cached_response() -> None:
    headers = {"Age": "12", "RateLimit-Remaining": "0", "RateLimit-Reset": "60"}
    signals = read_headers(200, headers, now=NOW)
    assert signals.cache_hit
    assert signals.age == 12.0
    assert signals.rate_limit is None
    assert signals.ignored == ("RateLimit-*: ignored on a response a cache served",)
    # A 304 from the origin itself (no cache header) keeps its fresh budget.
    del headers["Age"]
    signals = read_headers(304, headers, now=NOW)
    assert signals.cache_hit
    assert signals.rate_limit == RateLimit(0, 60.0, None, "RateLimit-*")


def test_read_headers_notes_what_it_ignored() -> None:
    signals = read_headers(
        503,
        {
            "Retry-After": "later",
            "Age": "old",
            "X-RateLimit-Remaining": "-3",
            "RateLimit": "x" * 5000,
        },
        now=NOW,
    )
    assert signals.retry_after is None
    assert signals.rate_limit is None
    assert signals.age is None
    assert signals.ignored == (
        "RateLimit: ignored, 5000 characters long",
        "Age 'old': not a number of seconds",
        "Retry-After 'later': neither delta-seconds nor an HTTP-date",
        "X-RateLimit-Remaining '-3': not a count",
    )


def test_notes_quote_little_of_a_long_value() -> None:
    signals = read_headers(200, {"Retry-After": "z" * 4000}, now=NOW)
    assert signals.ignored == (
        f"Retry-After {'z' * 40!r}... (4000 chars): neither delta-seconds nor an HTTP-date",
    )


def test_notes_stay_short_when_escapes_expand() -> None:
    (note,) = read_headers(200, {"Retry-After": "\x01\x00" * 50}, now=NOW).ignored
    assert note.startswith("Retry-After '\\x01\\x00\\x01")
    assert note.endswith("... (100 chars): neither delta-seconds nor an HTTP-date")
    assert len(note) < 130


# -- properties -------------------------------------------------------------------

_NEAR_NUMBERS = st.from_regex(r"\A[ \t]?[-+]?[0-9]{0,30}(\.[0-9]{0,6})?(e[0-9]{1,3})?[ \t]?\Z")
_NEAR_DATES = st.from_regex(
    r"\A((Sun|Tue|Sunday), )?[0-9]{1,3}[ -](Jan|Feb|Nov|Xyz)[ -][0-9]{1,6} "
    r"[0-9]{1,2}:[0-9]{1,2}(:[0-9]{1,2})?( (GMT|UT|EST|[+-][0-9]{4}|Z))?\Z"
)
_NEAR_STRUCTURED = st.from_regex(
    r'\A(("[a-z,;=\\"]{0,4}"|[a-z]{0,3}|limit|remaining|reset)(=-?[0-9]{0,20})?'
    r"(;[rtqwpk]{1,2}(=-?[0-9]{0,20}(\.[0-9]{0,3})?)?){0,4}, ?){0,5}\Z"
)
_HUGE = st.integers(min_value=-(10**60), max_value=10**60).map(str)
_LONG = st.builds(
    lambda piece, count: piece * count,
    st.sampled_from(["9", "1.", ",", ";", '"', "a=", "HIT ", "\u00e9", " "]),
    st.integers(min_value=0, max_value=50_000),
).map(lambda text: text[:100_000])
HOSTILE = st.one_of(
    st.text(), _NEAR_NUMBERS, _NEAR_DATES, _NEAR_STRUCTURED, _HUGE, _LONG, st.text(max_size=2000)
)

_NAMES = [
    "Age",
    "Retry-After",
    "Retry-After-Ms",
    "RateLimit",
    "RateLimit-Policy",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
    "X-RateLimit-Reset-After",
    "X-Cache",
    "X-Cache-Status",
    "CF-Cache-Status",
    "Cache-Status",
    "X-RateLimit-Remaining-Tokens",
    "X-RateLimit-Reset-Tokens",
    "Anthropic-RateLimit-Output-Tokens-Remaining",
    "Anthropic-RateLimit-Output-Tokens-Reset",
]
_NAME = st.one_of(
    st.sampled_from(_NAMES),
    st.sampled_from(_NAMES).map(str.lower),
    st.sampled_from(_NAMES).map(str.upper),
    st.text(max_size=20),
)
HEADERS = st.dictionaries(_NAME, HOSTILE, max_size=8)
# Without two spellings of one name, which a plain dict makes ambiguous.
UNAMBIGUOUS = HEADERS.filter(lambda h: len({k.lower() for k in h}) == len(h))
NOWS = st.floats(min_value=0, max_value=4e9, allow_nan=False)
# No deadline: a verdict on each example's wall time is one on the machine's load
# (one example took 388 ms of the default 200 with two cores busy).
_UNTIMED: dict[str, Any] = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
PROPERTY = settings(max_examples=300, **_UNTIMED)
HEADER_PROPERTY = settings(max_examples=200, **_UNTIMED)


def _assert_wait(value: float | None) -> None:
    assert value is None or (math.isfinite(value) and value >= 0.0)


def _assert_budget(budget: RateLimit | None) -> None:
    if budget is None:
        return
    assert isinstance(budget.remaining, int)
    assert 0 <= budget.remaining <= 10**15
    assert budget.limit is None or 0 <= budget.limit <= 10**15
    assert math.isfinite(budget.reset)
    assert budget.reset >= 0.0
    assert math.isfinite(budget.spacing)
    assert budget.spacing >= 0.0


@PROPERTY
@given(HOSTILE, NOWS)
def test_property_retry_after(value: str, now: float) -> None:
    _assert_wait(retry_after(value, now=now))


@HEADER_PROPERTY
@given(HEADERS, NOWS)
def test_property_rate_limit(headers: dict[str, str], now: float) -> None:
    _assert_budget(budget_of(headers, now=now))


@HEADER_PROPERTY
@given(st.integers(min_value=100, max_value=599), HEADERS)
def test_property_cache(status: int, headers: dict[str, str]) -> None:
    assert isinstance(cache_hit(status, headers), bool)
    _assert_wait(age_of(headers))


@HEADER_PROPERTY
@given(st.integers(min_value=100, max_value=599), UNAMBIGUOUS, NOWS)
def test_property_read_headers_agrees_and_notes_stay_short(
    status: int, headers: Mapping[str, str], now: float
) -> None:
    signals = read_headers(status, headers, now=now)
    _assert_wait(signals.retry_after)
    _assert_wait(signals.age)
    _assert_budget(signals.rate_limit)
    for window in signals.tokens:
        _assert_budget(window)
    # Each family reads its own fields: what the others say changes nothing.
    raw = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if raw is not None and len(raw) <= 4096 and "retry-after-ms" not in map(str.lower, headers):
        assert signals.retry_after == retry_after(raw, now=now)
    waits = ("retry-after", "retry-after-ms")
    others = {k: v for k, v in headers.items() if k.lower() not in waits}
    if signals.rate_limit is not None:
        assert signals.rate_limit == budget_of(others, now=now)
    for note in signals.ignored:
        assert len(note) < 200


@PROPERTY
@given(st.integers(min_value=0, max_value=10**15))
def test_property_delta_seconds_round_trip(seconds: int) -> None:
    assert retry_after(str(seconds), now=NOW) == float(seconds)


@PROPERTY
@given(st.integers(min_value=0, max_value=253_402_300_799), NOWS)
def test_property_http_date_round_trip(moment: int, now: float) -> None:
    text = formatdate(moment, usegmt=True)
    assert retry_after(text, now=now) == max(0.0, moment - now)


@PROPERTY
@given(st.integers(min_value=0, max_value=10 * 365 * 86400))
def test_property_epoch_reset_read_as_delta(ahead: int) -> None:
    for reset in (str(int(NOW) + ahead), str((int(NOW) + ahead) * 1000)):
        headers = {"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": reset}
        assert budget_of(headers, now=NOW) == RateLimit(1, float(ahead), None, "X-RateLimit-*")


@PROPERTY
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=1000), st.integers(0, 100_000)),
        min_size=1,
        max_size=6,
    )
)
def test_property_several_policies_pick_the_strictest(policies: list[tuple[int, int]]) -> None:
    field = ", ".join(f'"p{i}";r={r};t={t}' for i, (r, t) in enumerate(policies))
    budget = budget_of({"RateLimit": field}, now=NOW)
    assert budget is not None
    exhausted = [t for r, t in policies if r == 0]
    if exhausted:
        assert budget.remaining == 0
        assert budget.reset == max(exhausted)
    else:
        assert budget.spacing == max(t / r for r, t in policies)


@PROPERTY
@given(UNAMBIGUOUS, NOWS, st.randoms(use_true_random=False))
def test_property_names_are_read_in_any_case(
    headers: dict[str, str], now: float, rnd: random.Random
) -> None:
    scrambled = {
        "".join(c.upper() if rnd.random() < 0.5 else c.lower() for c in name): value
        for name, value in headers.items()
    }
    signals = read_headers(200, headers, now=now)
    read = read_headers(200, scrambled, now=now)
    # The notes quote a name as the server spelled it.
    assert dataclasses.replace(read, ignored=()) == dataclasses.replace(signals, ignored=())
    assert [n.lower() for n in read.ignored] == [n.lower() for n in signals.ignored]


# -- httpx's raw names ---------------------------------------------------------------


class _DecodedHeaders(httpx.Headers):
    """httpx's headers, read the full way: a subclass is not a raw_names type."""


_RAW_NAMES = st.sampled_from(
    [
        b"Content-Type",
        b"Server",
        b"Retry-After",
        b"retry-after",
        b"AGE",
        b"X-RateLimit-Remaining",
        b"X-RateLimit-Remaining-To\xe2\x84\xaaens",  # a Kelvin sign: lower() gives "k"
        b"X-Cache",
        b"X-Caf\xe9",
        b"RateLimit",
    ]
)
_RAW_VALUES = st.sampled_from([b"1", b"HIT", b"5", b"limit=10, remaining=3, reset=20", b"x"])


@settings(max_examples=300, **_UNTIMED)
@given(
    st.lists(st.tuples(_RAW_NAMES, _RAW_VALUES), max_size=6),
    st.sampled_from([200, 304, 429]),
    st.booleans(),
    st.sampled_from(["raw", "the adapter's"]),
)
def test_httpx_raw_names_read_as_the_decoded_names(
    raw: list[tuple[bytes, bytes]], status: int, from_cache: bool, fields: str
) -> None:
    """Checking httpx's names undecoded finds what decoding them all finds,
    whatever names were passed over before (the second read uses them): by
    ``Headers.raw``, and by the httpx adapter's own way (its list of fields)."""
    import autothrottle._httpx._common  # noqa: F401 (registers the adapter's way)
    from autothrottle._headers import RAW_TYPES, raw_names

    adapters = RAW_TYPES[httpx.Headers]
    try:
        if fields == "raw":
            raw_names(httpx.Headers)
        full = read_headers(status, _DecodedHeaders(raw), now=NOW, from_cache=from_cache)
        for _ in range(2):
            fast = read_headers(status, httpx.Headers(raw), now=NOW, from_cache=from_cache)
            assert fast == full
    finally:
        RAW_TYPES[httpx.Headers] = adapters


def test_the_raw_names_passed_over_are_bounded() -> None:
    from autothrottle._headers import _names, raw_names

    raw_names(httpx.Headers)
    for i in range(3 * _names._PASSED_KEPT):
        read_headers(200, httpx.Headers({f"X-Invented-{i}": "1"}), now=NOW)
    assert len(_names.PASSED_RAW) <= _names._PASSED_KEPT
    headers = httpx.Headers({"X-Invented-0": "1", "Age": "5"})
    assert read_headers(200, headers, now=NOW).age == 5.0
    read_headers(200, httpx.Headers({"X-Seen-After-The-Rest": "1"}), now=NOW)
    assert b"X-Seen-After-The-Rest" in _names.PASSED_RAW
