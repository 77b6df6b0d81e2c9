"""The header readers' bounds a mutation run (``scripts/mutants.py _headers``)
showed no test asserted: what ``now`` may be, and how long a value a dialect
reads at most (``docs/signals.md``, "Hostile headers"). Each asserts through
:func:`read_headers`, the one call the engine makes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from autothrottle._headers import RAW_TYPES, RateLimit, _names, raw_names, read_headers

NOW = 1_700_000_000.0


def openai_reset(value: str) -> float | None:
    """The reset OpenAI's request budget says, read as the engine reads it."""
    headers = {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": value}
    budget = read_headers(200, headers, now=NOW).rate_limit
    return None if budget is None else budget.reset


@pytest.mark.parametrize("now", [True, False, float("nan"), float("inf"), "1700000000", None])
def test_now_must_be_a_finite_number_not_a_bool(now: object) -> None:
    with pytest.raises(ValueError, match=r"^now must be a finite number") as raised:
        read_headers(200, {"Retry-After": "5"}, now=now)  # type: ignore[arg-type]
    assert repr(now) in str(raised.value)


def test_now_may_be_an_int() -> None:
    assert read_headers(200, {"Retry-After": "5"}, now=1_700_000_000).retry_after == 5.0


def test_a_go_duration_is_read_up_to_64_characters() -> None:
    eight = "0000001s" * 8  # eight terms, 64 characters
    assert openai_reset(eight) == 8.0
    assert openai_reset("0" + eight) is None  # 65: no duration a server means


def test_a_go_duration_is_read_up_to_eight_terms() -> None:
    assert openai_reset("1s" * 8) == 8.0
    assert openai_reset("1s" * 9) is None


def anthropic_reset(value: str) -> float | None:
    """The reset Anthropic's request budget says (an RFC 3339 date-time)."""
    headers = {
        "anthropic-ratelimit-requests-remaining": "1",
        "anthropic-ratelimit-requests-reset": value,
    }
    budget = read_headers(200, headers, now=NOW).rate_limit
    return None if budget is None else budget.reset


def test_a_leap_second_is_read_as_the_second_before_it_and_61_is_no_second() -> None:
    # NOW is 2023-11-14T22:13:20Z.
    assert anthropic_reset("2023-11-14T22:13:60Z") == 39.0
    assert anthropic_reset("2023-11-14T22:13:61Z") is None


@pytest.fixture
def away_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The machine's local zone five hours west of UTC, for one test."""
    monkeypatch.setenv("TZ", "Etc/GMT+5")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("away_from_utc")
def test_a_date_is_read_in_its_own_zone_whatever_the_machines() -> None:
    assert time.localtime(NOW).tm_hour == 17  # the zone took
    assert anthropic_reset("2023-11-14T22:13:30Z") == 10.0
    assert anthropic_reset("2023-11-14T17:13:30-05:00") == 10.0
    headers = {"Retry-After": "Tue, 14 Nov 2023 22:13:30 GMT"}
    assert read_headers(200, headers, now=NOW).retry_after == 10.0


def test_an_offset_of_60_minutes_is_no_date() -> None:
    assert anthropic_reset("2023-11-14T22:13:30-00:59") == 10.0 + 59 * 60
    assert anthropic_reset("2023-11-14T22:13:30-00:60") is None


def test_draft_7s_repeated_key_keeps_its_last_value_garbage_too() -> None:
    # A dictionary's repeated key keeps its last value (RFC 8941): here that
    # value is no count, and the field says nothing, not the earlier 50.
    field = "limit=100, remaining=50, reset=30, remaining=5=6"
    signals = read_headers(200, {"RateLimit": field}, now=NOW)
    assert signals.rate_limit is None
    assert signals.ignored
    budget = read_headers(200, {"RateLimit": field.rpartition(",")[0]}, now=NOW).rate_limit
    assert budget is not None
    assert budget.remaining == 50


@pytest.mark.parametrize("when", ["1700000030", "1700000030000"])
def test_draft_7s_reset_may_be_an_epoch_in_seconds_or_milliseconds(when: str) -> None:
    field = f"limit=100, remaining=50, reset={when}"
    budget = read_headers(200, {"RateLimit": field}, now=NOW).rate_limit
    assert budget is not None
    assert budget.reset == 30.0


def test_a_garbage_ratelimit_field_leaves_the_budget_to_the_next_dialect() -> None:
    headers = {
        "RateLimit": "limit=100, remaining=lots",
        "X-RateLimit-Remaining": "5",
        "X-RateLimit-Reset": "30",
        "X-RateLimit-Limit-Hour": "1000",
        "X-RateLimit-Remaining-Hour": "990",
    }
    signals = read_headers(200, headers, now=NOW)
    assert signals.rate_limit is not None
    assert (signals.rate_limit.remaining, signals.rate_limit.reset) == (5, 30.0)
    assert signals.ignored  # the garbage is noted


def ietf_policy(name: str) -> str | None:
    """The policy name a draft-8 ``RateLimit`` member named ``name`` reads as."""
    budget = read_headers(200, {"RateLimit": f"{name};r=5;t=30"}, now=NOW).rate_limit
    assert budget is not None
    return budget.policy


def test_a_policy_name_is_unquoted_unescaped_and_cut_to_64_characters() -> None:
    assert ietf_policy('"day"') == "day"
    assert ietf_policy('""') is None  # an empty name is no name
    assert ietf_policy(r'"a\"b\\c"') == 'a"b\\c'
    assert ietf_policy(r'"x\",y;z"') == 'x",y;z'  # an escaped quote ends no string
    assert ietf_policy('"' + "n" * 70 + '"') == "n" * 64


def test_a_separate_fields_count_is_its_first_items_bare_part() -> None:
    headers = {"RateLimit-Remaining": "5;w=1, 90;w=60", "RateLimit-Reset": "30, 3600"}
    budget = read_headers(200, headers, now=NOW).rate_limit
    assert budget is not None
    assert (budget.remaining, budget.reset) == (5, 30.0)


@pytest.mark.parametrize(
    ("value", "wait"),
    [
        ("999999999", 999999999.0),  # the largest delta
        ("1000000000", 0.0),  # the first epoch in seconds: 2001, long past
        ("1000000000000", 0.0),  # the first epoch in milliseconds: 2001 too
        ("100000000000000", None),  # from here on garbage, not a wait of millennia
    ],
)
def test_a_reset_is_a_delta_then_an_epoch_then_garbage_at_exact_edges(
    value: str, wait: float | None
) -> None:
    headers = {"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": value}
    budget = read_headers(200, headers, now=NOW).rate_limit
    assert (None if budget is None else budget.reset) == pytest.approx(wait)


def test_a_draft_8_members_reset_may_be_an_epoch() -> None:
    budget = read_headers(200, {"RateLimit": '"p";r=5;t=1700000030'}, now=NOW).rate_limit
    assert budget is not None
    assert budget.reset == 30.0


def test_a_bad_draft_8_member_is_noted_by_name_and_the_next_one_read() -> None:
    for bad, why in (('"a";r=x;t=1', "r= (remaining)"), ('"a";r=1;t=x', "t= (reset)")):
        signals = read_headers(200, {"RateLimit": f'{bad}, "b";r=5;t=30'}, now=NOW)
        assert signals.rate_limit is not None
        assert (signals.rate_limit.policy, signals.rate_limit.remaining) == ("b", 5)
        assert signals.ignored == (f"RateLimit: policy '\"a\"' has no valid {why}: skipped",)


def test_a_fields_bad_members_make_one_note_that_counts_the_rest() -> None:
    # One note a field, however many members a hostile server sends.
    field = '"a";r=x, "b";t=1, "c";r=-1, "d";r=5;t=30'
    signals = read_headers(200, {"RateLimit": field}, now=NOW)
    assert signals.ignored == (
        "RateLimit: policy '\"a\"' has no valid r= (remaining) (and 2 more): skipped",
    )
    assert signals.rate_limit is not None
    assert signals.rate_limit.policy == "d"
    two = read_headers(200, {"RateLimit": field.partition(', "c"')[0]}, now=NOW)
    assert two.ignored == (
        "RateLimit: policy '\"a\"' has no valid r= (remaining) (and 1 more): skipped",
    )


def test_a_string_that_ends_in_an_escaped_quote_ends_there() -> None:
    field = r'"a\"";r=1;t=1, "b";r=5;t=30'
    budget = read_headers(200, {"RateLimit": field}, now=NOW).rate_limit
    assert budget is not None
    assert sorted(str(window.policy) for window in budget.windows) == ['a"', "b"]


def test_a_window_of_another_count_joins_the_main_dialects_as_its_own() -> None:
    # Only a per-unit copy of the main window (same counts) lends it its
    # length; an hourly window of other counts is a window of its own.
    headers = {
        "RateLimit-Limit": "100",
        "RateLimit-Remaining": "50",
        "RateLimit-Reset": "30",
        "X-RateLimit-Limit-Hour": "1000",
        "X-RateLimit-Remaining-Hour": "990",
    }
    budget = read_headers(200, headers, now=NOW).rate_limit
    assert budget is not None
    assert [(w.remaining, w.window) for w in budget.windows] == [(50, None), (990, 3600.0)]


def test_a_budget_with_windows_reads_back_from_its_dict() -> None:
    headers = {
        "RateLimit-Limit": "100",
        "RateLimit-Remaining": "50",
        "RateLimit-Reset": "30",
        "X-RateLimit-Limit-Hour": "1000",
        "X-RateLimit-Remaining-Hour": "990",
    }
    budget = read_headers(200, headers, now=NOW).rate_limit
    assert budget is not None
    assert len(budget.windows) == 2
    assert RateLimit.from_dict(budget.to_dict()) == budget


def test_a_reset_after_field_is_a_delta_however_large() -> None:
    # Discord's X-RateLimit-Reset-After counts seconds from now: 1e9 of them
    # is a wait (the engine caps it at max_pause), not an epoch of 2001.
    headers = {"X-RateLimit-Remaining": "5", "X-RateLimit-Reset-After": "1000000000"}
    budget = read_headers(200, headers, now=NOW).rate_limit
    assert budget is not None
    assert budget.reset == 1e9


@pytest.mark.parametrize(
    ("text", "left"),
    [
        ("0000000000000000005", 5),  # leading zeros count for nothing
        ("999999999999999", 10**15 - 1),  # 15 digits: read as they are
        ("1000000000000000", 10**15),  # 16: saturated
    ],
)
def test_a_count_saturates_past_15_digits_and_not_before(text: str, left: int) -> None:
    headers = {"X-RateLimit-Remaining": text, "X-RateLimit-Reset": "30"}
    budget = read_headers(200, headers, now=NOW).rate_limit
    assert budget is not None
    assert budget.remaining == left


@pytest.fixture
def raw_httpx() -> Iterator[None]:
    """httpx's names checked undecoded by ``Headers.raw`` (not the adapter's
    own list), and the names passed over forgotten: the tests below count
    them, and a run before (mutmut's, in the same process) would have left
    some there."""
    kept = RAW_TYPES.get(httpx.Headers)
    raw_names(httpx.Headers)
    _names.PASSED_RAW.clear()
    yield
    _names.PASSED_RAW.clear()
    if kept is None:
        del RAW_TYPES[httpx.Headers]
    else:
        RAW_TYPES[httpx.Headers] = kept


@pytest.mark.usefixtures("raw_httpx")
def test_the_raw_names_passed_over_are_remembered_as_sent() -> None:
    read_headers(200, httpx.Headers({"X-Passed-Over": "1", "server": "x"}), now=NOW)
    assert sorted(_names.PASSED_RAW) == [b"X-Passed-Over", b"server"]


@pytest.mark.usefixtures("raw_httpx")
def test_the_raw_names_passed_over_are_never_more_than_their_bound() -> None:
    sizes = set()
    for i in range(_names._PASSED_KEPT + 2):
        read_headers(200, httpx.Headers({f"X-Invented-{i}": "1"}), now=NOW)
        sizes.add(len(_names.PASSED_RAW))
    assert max(sizes) == _names._PASSED_KEPT


@pytest.mark.usefixtures("raw_httpx")
def test_a_value_that_spells_a_name_passed_over_is_still_read() -> None:
    # A header named "Hit" is passed over; X-Cache's value "Hit" is a value,
    # not a name: the response is read, and a cache answered it.
    read_headers(200, httpx.Headers([(b"Hit", b"1")]), now=NOW)
    assert read_headers(200, httpx.Headers([(b"X-Cache", b"Hit")]), now=NOW).cache_hit


def test_a_bad_limit_is_noted_by_its_name_and_the_rest_still_read() -> None:
    headers = {"X-RateLimit-Remaining": "5", "X-RateLimit-Limit": "lots", "X-RateLimit-Reset": "30"}
    signals = read_headers(200, headers, now=NOW)
    assert signals.ignored == ("X-RateLimit-Limit 'lots': not a count",)
    assert signals.rate_limit is not None
    assert (signals.rate_limit.remaining, signals.rate_limit.limit) == (5, None)


def test_a_go_duration_reset_may_be_a_list_its_first_member_read_as_one() -> None:
    assert openai_reset("6m0s, 1h0m0s") == 360.0


def test_an_epoch_reset_may_be_a_list_its_first_member_read_against_now() -> None:
    headers = {"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "1700000030, 1700003600"}
    budget = read_headers(200, headers, now=NOW).rate_limit
    assert budget is not None
    assert budget.reset == 30.0


def windows_of(
    headers: dict[str, str],
) -> list[tuple[str, str | None, int, int | None, float | None]]:
    """Each window a budget holds: (source, policy, remaining, limit, window)."""
    budget = read_headers(200, headers, now=NOW).rate_limit
    assert budget is not None
    return [
        (w.source, w.policy, w.remaining, w.limit, w.window) for w in budget.windows or (budget,)
    ]


def test_riots_windows_each_read_whole_a_missing_count_as_none_spent() -> None:
    headers = {
        "X-App-Rate-Limit": "20:1,100:120",
        "X-App-Rate-Limit-Count": "20:1",  # the second's spent; none counted over 120 s
        "X-Method-Rate-Limit": "0:1,50:60",  # a window of no requests is no window
    }
    assert sorted(windows_of(headers)) == [
        ("X-App-Rate-Limit", "120s", 100, 100, 120.0),
        ("X-App-Rate-Limit", "1s", 0, 20, 1.0),
        ("X-Method-Rate-Limit", "60s", 50, 50, 60.0),
    ]


def test_riots_method_list_is_read_without_an_app_list_and_after_a_bad_one() -> None:
    method = {"X-Method-Rate-Limit": "50:60"}
    expected = [("X-Method-Rate-Limit", "60s", 50, 50, 60.0)]
    assert windows_of(method) == expected
    headers = {"X-App-Rate-Limit": "garbage", **method}
    assert windows_of(headers) == expected
    notes = read_headers(200, headers, now=NOW).ignored
    assert notes == ("X-App-Rate-Limit 'garbage': not LIMIT:SECONDS,...",)


def test_a_riot_list_with_one_bad_pair_is_no_list() -> None:
    signals = read_headers(200, {"X-App-Rate-Limit": "20:1,x:120"}, now=NOW)
    assert signals.rate_limit is None
    assert signals.ignored == ("X-App-Rate-Limit '20:1,x:120': not LIMIT:SECONDS,...",)


def test_a_bad_unit_window_is_noted_by_its_name_and_the_next_unit_read() -> None:
    headers = {
        "X-RateLimit-Remaining-Minute": "many",
        "X-RateLimit-Limit-Hour": "1000",
        "X-RateLimit-Remaining-Hour": "990",
        "X-RateLimit-Limit-Day": "x",
        "X-RateLimit-Remaining-Day": "5",
    }
    assert sorted(windows_of(headers)) == [
        ("X-RateLimit-*-Day", "day", 5, None, 86400.0),
        ("X-RateLimit-*-Hour", "hour", 990, 1000, 3600.0),
    ]
    assert read_headers(200, headers, now=NOW).ignored == (
        "X-RateLimit-Remaining-Minute 'many': not a count",
        "X-RateLimit-Limit-Day 'x': not a count",
    )


def test_a_bad_shopify_field_is_noted_by_its_name() -> None:
    signals = read_headers(200, {"X-Shopify-Shop-Api-Call-Limit": "32"}, now=NOW)
    assert signals.ignored == ("X-Shopify-Shop-Api-Call-Limit '32': not USED/LIMIT",)
