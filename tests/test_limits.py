"""Rate-limit budgets and pauses through their own interface, with plain numbers
(docs/signals.md, "Rate-limit headers").

Only :class:`Budget`, its :class:`Limits` record, budgets and plain numbers: no
throttle, slot, clock or header.
"""

from __future__ import annotations

import math

import pytest

from autothrottle._headers import HeaderSignals
from autothrottle._limits import Budget, Limits, rounding
from autothrottle.store import RateLimit


def test_a_pause_only_ever_grows() -> None:
    limits = Limits()
    assert limits.pause(10.0) is True
    assert limits.pause(5.0) is False
    assert limits.pause(10.0) is False
    assert limits.pause_until == 10.0


def test_what_remains_is_spread_until_the_reset() -> None:
    limits = Limits()
    assert Budget(300.0).apply(limits, RateLimit(4, 2.5), 100.0, 99.9, refused=False) is None
    assert limits.budget_gap == pytest.approx(2.5 / 4)
    assert limits.budget_until == pytest.approx(102.5)
    assert limits.rate_limit == RateLimit(4, 2.5)


def test_a_whole_second_reset_may_be_a_second_nearer() -> None:
    limits = Limits()
    Budget(300.0).apply(limits, RateLimit(4, 3.0), 100.0, None, refused=False)
    assert limits.budget_gap == pytest.approx((3.0 - 1.0) / 4)


def test_a_budget_holds_no_longer_than_max_pause() -> None:
    limits = Limits()
    Budget(2.0).apply(limits, RateLimit(1, 3600.0, 10, window=3600.0), 100.0, None, refused=False)
    assert limits.budget_until == 102.0
    assert limits.sustained_until == 102.0


def test_the_policys_own_pace_holds_for_its_window() -> None:
    limits = Limits()
    Budget(300.0).apply(limits, RateLimit(5, 1.0, 10, window=10.0), 100.0, None, refused=False)
    assert limits.sustained_gap == pytest.approx(1.0)  # exactly the stated pace
    assert limits.sustained_until == pytest.approx(110.0)


def test_a_spent_budget_pauses_until_its_reset() -> None:
    limits = Limits()
    wait = Budget(300.0).apply(limits, RateLimit(0, 30.0), 100.0, 99.0, refused=False)
    assert wait == 30.0
    assert limits.pause_until == -math.inf  # the caller pauses (capped, logged)


def test_a_unit_spent_at_the_policys_own_pace_ends_the_window_one_gap_after_the_send() -> None:
    budget = RateLimit(0, 1.0, 10, window=1.0)  # 10 a second, t rounded up to 1 s
    wait = Budget(300.0).apply(Limits(), budget, 100.0, 99.95, refused=False)
    assert wait == pytest.approx(0.1 - 0.05)


def test_a_spent_budget_renews_the_policys_own_pace() -> None:
    # A host paced at exactly its rate says r=0 after every request: its pace
    # is stated all the same, and must not lapse a window after the last r > 0.
    limits = Limits()
    budget = RateLimit(0, 1.0, 10, window=1.0)
    Budget(300.0).apply(limits, budget, 100.0, 99.95, refused=False)
    assert limits.sustained_gap == pytest.approx(0.1)
    assert limits.sustained_until == pytest.approx(101.0)
    assert limits.stated_gap(100.5) == pytest.approx(0.1)


def test_a_refusal_pauses_for_the_whole_reset() -> None:
    budget = RateLimit(0, 1.0, 10, window=1.0)
    assert Budget(300.0).apply(Limits(), budget, 100.0, 99.95, refused=True) == 1.0


def test_a_loaded_record_ends_its_pause_and_budgets_within_max_pause() -> None:
    limits = Limits(pause_until=4000.0, budget_until=4000.0, sustained_until=50.0)
    limits.bound(100.0, 2.0)
    assert (limits.pause_until, limits.budget_until, limits.sustained_until) == (
        102.0,
        102.0,
        50.0,
    )


def test_a_unit_spent_by_a_request_sent_at_an_unknown_time_ends_the_window_a_gap_later() -> None:
    # No send time: the request is taken as sent when its answer came, so the
    # window ends one gap of the policy's pace after the response, not at the
    # second t rounds to.
    budget = RateLimit(0, 1.0, 10, window=1.0)
    assert Budget(300.0).apply(Limits(), budget, 100.0, None, refused=False) == pytest.approx(0.1)


def test_a_refusal_that_read_no_headers_asks_for_no_pause_past_the_rounding() -> None:
    # docs/recovery.md, "At the stated pace": only a pause the refusal asks for
    # (a Retry-After, an exhausted budget's reset) can make it a penalty.
    assert rounding(None, 0.5) is True
    assert rounding(HeaderSignals(retry_after=1.0), 0.5) is True
    assert rounding(HeaderSignals(retry_after=2.0), 0.5) is False
    assert rounding(HeaderSignals(retry_after=2.0), 1.5) is True  # 1.5 s rounds up to 2
