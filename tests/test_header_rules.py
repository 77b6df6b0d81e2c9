"""The header readers' bounds a mutation run (``scripts/mutants.py _headers``)
showed no test asserted: what ``now`` may be, and how long a value a dialect
reads at most (``docs/signals.md``, "Hostile headers"). Each asserts through
:func:`read_headers`, the one call the engine makes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from autothrottle._headers import read_headers

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
